"""The examples in the docstrings run as written."""
import doctest

import pserver
import pserver._arrays
import pserver._calls
import pserver._checkpoint
import pserver._client
import pserver._config
import pserver._errors
import pserver._etcd
import pserver._group
import pserver._handles
import pserver._server
import pserver._tables

# The modules whose docstrings hold examples that run (the others' are
# skipped: they need a checkpoint, etcd or a GPU).
WITH_EXAMPLES = (pserver, pserver._client, pserver._config, pserver._group, pserver._server,
                 pserver._tables)


def test_docstring_examples():
    for module in WITH_EXAMPLES + (pserver._arrays, pserver._calls, pserver._checkpoint,
                                   pserver._errors, pserver._etcd, pserver._handles):
        result = doctest.testmod(module, extraglobs={"pserver": pserver})
        assert result.failed == 0, module.__name__
        assert module not in WITH_EXAMPLES or result.attempted > 0, module.__name__
