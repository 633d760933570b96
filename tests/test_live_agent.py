"""The agent's `live` operation, pure parts: it computes the plugin's socket paths and its
`SGLANG_PLUGINS` check by its own copy of the scheme (only the agent package travels to a host),
which must give the plugin's own answers; and which sockets a request goes to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opspatch.hosts.agent import live as agent_live
from opspatch.hosts.liveplugin import socket_paths

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("environ", "uid"),
    [
        ({}, 0),
        ({}, 1000),
        ({"OPSPATCH_LIVE_DIR": "/srv/live"}, 1000),
        ({"OPSPATCH_LIVE_DIR": ""}, 0),
    ],
)
def test_the_agent_finds_sockets_where_the_plugin_binds_them(
    environ: dict[str, str], uid: int
) -> None:
    assert agent_live.base_dir(environ, uid) == socket_paths.base_dir(environ, uid)
    assert agent_live.PLUGIN_NAME == socket_paths.PLUGIN_NAME
    assert socket_paths.socket_name("scheduler", 0) == agent_live.ENTRY_SOCKET


@pytest.mark.parametrize(
    "value", ["", "opspatch_live", "other,opspatch_live", "other", " other , more "]
)
def test_the_agent_says_sglang_plugins_without_the_plugin_as_the_plugin_does(value: str) -> None:
    environ = {"SGLANG_PLUGINS": value}
    assert agent_live.plugins_filtered_out(environ) == socket_paths.plugins_filtered_out(environ)


def test_a_take_goes_to_the_entry_rank_main_and_detokenizer_and_list_to_every_socket() -> None:
    names = [
        "scheduler-tp1.sock",
        "main.sock",
        "scheduler-tp10.sock",
        "scheduler-tp0.sock",
        "detokenizer.sock",
    ]
    assert agent_live.sockets_to_ask(names, "take") == [
        "main.sock",
        "detokenizer.sock",
        "scheduler-tp0.sock",
    ]
    assert agent_live.sockets_to_ask(names, "revert") == agent_live.sockets_to_ask(names, "take")
    assert agent_live.sockets_to_ask(names, "list") == [
        "main.sock",
        "detokenizer.sock",
        "scheduler-tp0.sock",
        "scheduler-tp1.sock",
        "scheduler-tp10.sock",
    ]


def test_another_users_engine_is_said_unread_never_not_listening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that is neither root nor the engine's user cannot see its socket folder (0700)
    nor connect (the plugin admits root and its own uid): its folder would look absent, so the
    agent says it could not ask instead of "the plugin is not installed"."""
    pid_file = tmp_path / "engine.pid"
    pid_file.write_text(f"{os.getpid()}\n")  # this test's process stands for the engine
    monkeypatch.setattr(agent_live.os, "geteuid", lambda: os.getuid() + 4242)
    reply = agent_live.op_live(
        {
            "fix": {"op": "list"},
            "pid": None,
            "pid_file": str(pid_file),
            "url": None,
            "env": {},
            "timeout": 1.0,
        }
    )
    assert reply["unread"] is True
    assert reply["missing"] is not None and "could not be asked" in reply["missing"]
    assert "not installed" not in reply["missing"]
    assert reply["answers"] == []


@pytest.mark.parametrize("closed", ["socket folder", "base folder"])
def test_a_folder_this_user_may_not_enter_is_said_unread(
    closed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's own uid among its processes, but its socket folder (or the base above it)
    closed to this user: what the engine holds is not known, so the reply is `unread` (status
    says "could not be listed"), never a plain `missing` read as "holds nothing"."""
    pid_file = tmp_path / "engine.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    folder = tmp_path / "live"
    folder.mkdir()
    if closed == "socket folder":
        monkeypatch.setattr(agent_live, "server_folder", lambda pid, env: (str(folder), env))

        listdir = os.listdir

        def refuse(path: str) -> list[str]:
            if path == str(folder):
                raise PermissionError(13, "Permission denied", path)
            return listdir(path)

        monkeypatch.setattr(agent_live.os, "listdir", refuse)
    else:
        monkeypatch.setattr(agent_live, "server_folder", lambda pid, env: (None, env))
        monkeypatch.setattr(agent_live, "base_dir", lambda environ, uid: str(folder))
        monkeypatch.setattr(agent_live.os, "access", lambda path, mode: False)
    reply = agent_live.op_live(
        {
            "fix": {"op": "list"},
            "pid": None,
            "pid_file": str(pid_file),
            "url": None,
            "env": {},
            "timeout": 1.0,
        }
    )
    assert reply["unread"] is True
    assert reply["missing"] is not None and "may not enter" in reply["missing"]
    assert reply["answers"] == []
