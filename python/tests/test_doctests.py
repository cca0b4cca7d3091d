"""The examples in the docstrings run as written."""
import doctest

import pserver
import pserver._core
import pserver._errors
import pserver._tables


def test_docstring_examples():
    for module in (pserver, pserver._core, pserver._errors, pserver._tables):
        result = doctest.testmod(module, extraglobs={"pserver": pserver})
        assert result.failed == 0, module.__name__
        assert module is pserver._errors or result.attempted > 0
