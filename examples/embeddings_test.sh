#!/usr/bin/env bash
# Runs the embeddings example in --quick form: it exits non-zero unless the
# held-out RMSE falls below 60% of its start. Also checks that it printed a
# row per epoch, with falling RMSE, and the table's stats.
set -euo pipefail
out="$("$1" --quick 2>&1)" || { echo "$out"; exit 1; }
echo "$out"
grep -q "held-out RMSE fell from" <<<"$out"
grep -q "^server 0: .* rows" <<<"$out"
# Held-out RMSE (4th column) of each epoch row; the last must be below the first.
awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/ { rmse[n++] = $4 }
     END { if (n < 2 || !(rmse[n - 1] < rmse[0])) { print "RMSE did not fall: " n " rows"; exit 1 } }' \
  <<<"$out"
