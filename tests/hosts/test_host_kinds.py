"""The host kinds table (quantbench.hosts.kinds.KINDS): every kind has its class and options, the class
follows the base protocol, and adding a kind is one entry."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

from quantbench.errors import UserError
from quantbench.hosts import kinds, registry
from quantbench.hosts.process import AnyHost, ProcessHost, WorkerHost, protocol_members

def _class(kind: kinds.HostKind):
    module, name = kind.host_class.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("name", list(kinds.KINDS))
def test_every_kind_has_its_class_and_options(name):
    kind = kinds.KINDS[name]
    assert kind.name == name
    cls = _class(kind)
    protocol = protocol_members(AnyHost) + (protocol_members(WorkerHost) if cls.runs_workers else ())
    fields = getattr(cls, "__dataclass_fields__", {})   # name, kind: set by its constructor
    missing = [m for m in protocol if not hasattr(cls, m) and m not in fields]
    assert not missing, f"{cls.__name__} lacks {missing}"
    assert set(kind.list_options) | set(kind.path_lists) | {k for k, _ in kind.word_options} <= set(kind.options)
    assert len(set(kind.options)) == len(kind.options)


def test_a_kind_that_starts_workers_writes_its_command():
    for kind in kinds.KINDS.values():
        cls = _class(kind)
        if cls.runs_workers:
            assert issubclass(cls, ProcessHost) and cls.command is not ProcessHost.command, cls.__name__


@dataclasses.dataclass
class _BoardHost(ProcessHost):
    """A throwaway kind: this machine's python, reached under another kind name."""


def test_adding_a_kind_is_one_entry(monkeypatch, tmp_path):
    board = kinds.HostKind("board", f"{__name__}:_BoardHost", ("serial",), ("baud",))
    monkeypatch.setitem(kinds.KINDS, "board", board)
    text = 'b1 = { kind = "board", serial = "/dev/ttyUSB0" }\n'
    spec = registry.hosts_from_text(Path("hosts.toml"), text, tmp_path)["b1"]
    assert (spec.kind, spec.options, spec.origin) == ("board", {"serial": "/dev/ttyUSB0"}, "hosts.toml:1")
    host = registry.make_host(spec)
    assert isinstance(host, _BoardHost) and host.describe() == "board"
    with pytest.raises(UserError, match=r"hosts.toml:1: host 'b1': kind board needs serial"):
        registry.hosts_from_text(Path("hosts.toml"), 'b1 = { kind = "board", baud = "9600" }\n', tmp_path)
    with pytest.raises(UserError, match=r"unknown option\(s\) python for kind board; known: serial, baud"):
        registry.hosts_from_text(Path("hosts.toml"), 'b1 = { kind = "board", serial = "x", python = "y" }\n',
                                 tmp_path)


def test_an_unknown_kind_lists_the_table(tmp_path):
    with pytest.raises(UserError, match=r"kind 'board'; choose from local, emulated, ssh, imported, masked$"):
        registry.hosts_from_text(Path("hosts.toml"), 'b1 = { kind = "board" }\n', tmp_path)
