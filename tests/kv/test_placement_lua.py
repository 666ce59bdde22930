"""Static checks of kv/lua: every operation documents KEYS/ARGV/returns, and every key comes through KEYS.

Redis Cluster requires a script to declare every key it touches; the scripts follow one naming rule so that
this can be checked without running them: key expressions are `KEYS[...]`, `unpack(KEYS)`, a `*_key` variable
or a `*_keys[...]` table entry, and those variables and tables are only ever filled from KEYS.
"""

from __future__ import annotations

import importlib.resources
import re

import pytest

from ardiff.kv.records import PodRecord, SessionBinding
from ardiff.kv.scripts import READ_ONLY_SCRIPTS, SCRIPTS, Library

LUA = importlib.resources.files("ardiff.kv") / "lua"
LUA_FILES = sorted(entry.name for entry in LUA.iterdir() if entry.name.endswith(".lua"))

# `redis.call('CMD', a, b, ...)` / `redis.pcall(...)`: the command and its arguments (one level of nesting).
CALL = re.compile(r"redis\.p?call\(\s*'([A-Z]+)'\s*(?:,\s*((?:[^()]|\([^()]*\))*))?\)")
KEY_EXPRESSION = re.compile(r"^(KEYS\[[^\]]+\]|unpack\(KEYS\)|[\w.]*_key|[\w.]*_keys\[\w+(\[\w+\])?\])$")
# Argument positions that name keys, for the commands the scripts use (default: the first argument).
KEY_POSITIONS = {"DEL": "all", "UNLINK": "all", "EXISTS": "all", "XGROUP": (1,)}
KEYLESS = {"TIME"}


def split_arguments(text: str) -> list[str]:
    args, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            args.append(current.strip())
            current = ""
            continue
        if char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
        current += char
    if current.strip():
        args.append(current.strip())
    return args


def key_arguments(command: str, args: list[str]) -> list[str]:
    if command in KEYLESS:
        return []
    positions = KEY_POSITIONS.get(command, (0,))
    return args if positions == "all" else [args[i] for i in positions]


def strip_comments(source: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in source.splitlines())


def test_every_operation_has_a_script_file() -> None:
    assert sorted(f"{name}.lua" for name in SCRIPTS) == [
        name for name in LUA_FILES if not name.startswith("_")
    ]


@pytest.mark.parametrize("name", [name for name in LUA_FILES if not name.startswith("_")])
def test_script_header_documents_keys_argv_and_returns(name: str) -> None:
    header = []
    for line in (LUA / name).read_text().splitlines():
        if not line.startswith("--"):
            break
        header.append(line)
    text = "\n".join(header)
    assert header, f"{name} must open with a header comment"
    assert header[0].startswith(f"-- {name}:"), f"{name} must open with '-- {name}: <purpose>'"
    for section in ("KEYS[", "ARGV", "Returns"):
        assert section in text, f"{name} header must document {section}"


@pytest.mark.parametrize("name", LUA_FILES)
def test_every_key_comes_through_keys(name: str) -> None:
    source = strip_comments((LUA / name).read_text())
    calls = CALL.findall(source)
    assert calls or name == "_lib.lua" or "redis.call" not in source
    for command, arg_text in calls:
        for key in key_arguments(command, split_arguments(arg_text)):
            assert KEY_EXPRESSION.match(key), (
                f"{name}: {command} key argument {key!r} does not come from KEYS"
            )
    for target, value in re.findall(r"([\w.]*_keys?(?:\[[^\]]+\])?)\s*=(?!=)\s*(\{\}|[^,\n}]+)", source):
        value = value.strip()
        if value == "{}":  # an empty key table, filled below
            continue
        assert "KEYS[" in value or re.fullmatch(r"[\w.]*_keys\[\w+\]", value), (
            f"{name}: {target} = {value} must take its value from KEYS"
        )
        assert ".." not in value, f"{name}: {target} is built, not taken from KEYS"
        assert "ARGV" not in value, f"{name}: {target} comes from ARGV, not KEYS"


def test_every_redis_call_was_seen_by_the_checker() -> None:
    """Guards the regex: a call it cannot parse would silently escape the key check."""
    for name in LUA_FILES:
        source = strip_comments((LUA / name).read_text())
        assert len(CALL.findall(source)) == source.count("redis.call(") + source.count("redis.pcall("), name


def test_status_codes_match_the_python_enum() -> None:
    from ardiff.kv.errors import ScriptStatus

    lib = (LUA / "_lib.lua").read_text()
    for status in ScriptStatus:
        assert re.search(rf"^local {status.name} = {status.value}$", lib, re.MULTILINE), status


def test_the_library_holds_the_record_fields_and_the_shared_helpers_once_and_every_operation() -> None:
    """Issue 42 item 4: one library, named by its source's hash; the field tables and _lib.lua once, each
    operation's file as a function body, registered under `<library>_<operation>`, reads `no-writes`."""
    fields = "\n".join(
        f"local {table} = {{" + ", ".join(f"'{f}'" for f in record.FIELDS) + "}"
        for table, record in (("BINDING_FIELDS", SessionBinding), ("POD_FIELDS", PodRecord))
    )
    library = Library.current()
    assert re.fullmatch(r"ardiff_[0-9a-f]{12}", library.name)
    source = library.source
    assert source.startswith(f"#!lua name={library.name}\n")
    lib = (LUA / "_lib.lua").read_text()
    assert source.count(fields) == 1
    assert source.count(lib) == 1
    assert source.index(fields) < source.index("local KEYS, ARGV") < source.index(lib)
    for name in SCRIPTS:
        body = (LUA / f"{name}.lua").read_text()
        assert f"local function op_{name}()\n{body}\nend\n" in source, name
        flags = "{'no-writes'}" if name in READ_ONLY_SCRIPTS else "{}"
        assert f"register('{library.name}_{name}', op_{name}, {flags})" in source, name
    assert library.functions == {name: f"{library.name}_{name}" for name in SCRIPTS}
    assert Library.current() == library  # the same source, the same name
