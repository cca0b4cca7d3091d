"""Parameter configs (optimizer, schedule, settings) and client and server
options built from keyword arguments, and the number every setting becomes at the C ABI."""

from __future__ import annotations

import contextlib
from typing import (Any, ContextManager, Dict, Iterator, Mapping, Optional, Sequence, Tuple,
                    Union)

from . import capi as _c
from ._errors import InvalidArgument


def _setting(what: str, key: str, value: Any) -> float:
    """A config or table setting as the number the C ABI takes (booleans as 0/1)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{what} setting {key!r} must be a number, got {value!r}") from None


class _Config:
    """A pserver_param_config_t built from keyword arguments, freed on exit."""

    def __init__(self, optimizer: Optional[str], schedule: Optional[str],
                 config: Union[None, str, Mapping[str, Any]], settings: Mapping[str, Any]):
        self.ptr = _c.pserver_param_config_new()
        try:
            merged: Dict[str, Any] = {}
            if isinstance(config, str):
                _c.pserver_param_config_parse_text(self.ptr, config)
            elif config is not None:
                merged.update(config)
            merged.update({k: v for k, v in settings.items() if v is not None})
            optimizer = merged.pop("optimizer", None) if optimizer is None else optimizer
            schedule = merged.pop("schedule", None) if schedule is None else schedule
            merged.pop("optimizer", None)
            merged.pop("schedule", None)
            if optimizer is not None:
                _c.pserver_param_config_set_optimizer(self.ptr, str(optimizer))
            if schedule is not None:
                _c.pserver_param_config_set_schedule(self.ptr, str(schedule))
            for key, value in merged.items():
                _c.pserver_param_config_set(self.ptr, key, _setting("config", key, value))
        except BaseException:
            _c.pserver_param_config_delete(self.ptr)
            raise

    def text(self) -> str:
        return _c.pserver_param_config_text(self.ptr)[1]

    def __enter__(self) -> "_Config":
        return self

    def __exit__(self, *exc: Any) -> None:
        _c.pserver_param_config_delete(self.ptr)
        self.ptr = None


def param_config_text(optimizer: Optional[str] = None, *, schedule: Optional[str] = None,
                      config: Union[None, str, Mapping[str, Any]] = None,
                      **settings: Any) -> str:
    """The ParameterConfig that `Client.init` would send, in protobuf text format.

    >>> import pserver
    >>> pserver.param_config_text("adam", lr=0.01, beta1=0.8, clip_norm=1.0)
    'optimizer { adam { beta1: 0.8 } } learning_rate { learning_rate: 0.01 } clipping { clip_norm: 1 }'
    """
    with _Config(optimizer, schedule, config, settings) as cfg:
        return cfg.text()


def _int(value: Optional[Any]) -> Optional[int]:
    return None if value is None else int(value)


@contextlib.contextmanager
def _options(kind: str, settings: Sequence[Tuple[str, Any]]) -> Iterator[Any]:
    """A new pserver_<kind>_options_t with each (setting, value) whose value
    is not None set through pserver_<kind>_options_set_<setting>; freed on
    exit."""
    opts = getattr(_c, f"pserver_{kind}_options_new")()
    try:
        for setting, value in settings:
            if value is not None:
                getattr(_c, f"pserver_{kind}_options_set_{setting}")(opts, value)
        yield opts
    finally:
        getattr(_c, f"pserver_{kind}_options_delete")(opts)


def _client_options(timeout: Optional[float], block_bytes: Optional[int],
                    max_request_bytes: Optional[int],
                    channels_per_server: Optional[int]) -> ContextManager[Any]:
    if timeout is not None and timeout <= 0:
        raise InvalidArgument(f"timeout must be positive, got {timeout}")
    return _options("client", [
        ("timeout_ms", None if timeout is None else max(1, int(timeout * 1000))),
        ("block_bytes", _int(block_bytes)),
        ("max_request_bytes", _int(max_request_bytes)),
        ("channels_per_server", _int(channels_per_server)),
    ])


def _server_options(host: str, port: int, index: int, num_threads: int,
                    checkpoint_dir: Optional[str],
                    advertise_host: Optional[str] = None) -> ContextManager[Any]:
    return _options("server", [
        ("host", host), ("advertise_host", advertise_host), ("port", int(port)),
        ("index", int(index)),
        ("num_threads", int(num_threads)),
        ("checkpoint_dir", None if checkpoint_dir is None else str(checkpoint_dir)),
    ])
