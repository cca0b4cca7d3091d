#!/usr/bin/env bash
# bazel test //deploy:manifests_test: deploy/manifests_test.py under Debian's python3.
set -euo pipefail
exec /usr/bin/python3 deploy/manifests_test.py -v
