"""Every environment variable the gateway reads is declared once and documented: the
declarations (gateway/environment/) are what Settings.from_env reads and what the
configuration reference of the documentation site is written from."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from gateway.environment import ENV_NAMES, VARIABLES, Variable
from gateway.settings import Settings
from tests.support.environment import RecordingEnv

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "adm-7f3c9e1d2b4a5968-0123456789abcdef"


def reference() -> ModuleType:
    """The site's build hook (docs/hooks/reference.py), which writes the page."""
    path = ROOT / "docs" / "hooks" / "reference.py"
    spec = importlib.util.spec_from_file_location("docs_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_from_env_reads_exactly_the_declared_names() -> None:
    env = RecordingEnv({"GATEWAY_ADMIN_TOKEN": TOKEN})
    Settings.from_env(env)
    assert env.read == ENV_NAMES == {v.name for v in VARIABLES}


def test_each_name_and_field_is_declared_once() -> None:
    names = [v.name for v in VARIABLES]
    fields = [v.field for v in VARIABLES]
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)
    assert len(set(fields)) == len(fields), sorted(f for f in fields if fields.count(f) > 1)
    settings_fields = {f.name for f in dataclasses.fields(Settings)}
    assert set(fields) <= settings_fields, set(fields) - settings_fields


@pytest.mark.parametrize("variable", VARIABLES, ids=lambda v: v.name)
def test_each_declaration_is_documented(variable: Variable) -> None:
    doc = variable.doc
    assert doc and doc == " ".join(doc.split()), "one paragraph, no line breaks"
    assert doc[0].isupper() or doc[0] == "`", doc
    assert doc.endswith("."), doc
    if variable.kind in ("number", "integer"):
        assert variable.low is not None and variable.high is not None
        assert variable.low <= float(variable.default) <= variable.high  # type: ignore[arg-type]
        assert variable.unit, f"{variable.name}: a number says its unit"
    if variable.kind in ("choice", "switch", "lowered"):
        assert variable.choices, f"{variable.name}: the values it takes"
    if variable.default is None:
        assert variable.shown_default, f"{variable.name}: say what unset means"


@pytest.mark.parametrize("variable", VARIABLES, ids=lambda v: v.name)
def test_each_declared_default_is_the_settings_default(variable: Variable) -> None:
    # Settings() (tests, the bench) and Settings.from_env({}) must agree.
    assert getattr(Settings(), variable.field) == variable.default
    if variable.name != "GATEWAY_ADMIN_TOKEN":  # required while auth is on
        read = variable.read({})
        assert read == variable.default, (read, variable.default)


def _names_read_in(source: str) -> set[str]:
    """Environment names read literally: os.environ.get("X"), os.environ["X"],
    os.getenv("X"), env.get("X") on a copy of the environment."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("get", "getenv", "pop"):
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names.add(arg.value)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            if isinstance(node.slice.value, str):
                names.add(node.slice.value)
    return {n for n in names if re.fullmatch(r"(GATEWAY_[A-Z0-9_]+|[A-Z]+_URL)", n)}


def test_the_server_reads_no_undeclared_variable() -> None:
    # Outside settings, the commands read a few variables before Settings exists (the
    # log format, the database URL for `gateway migrate` and `gateway token`): each must
    # be a declared one, so that the reference documents it.
    undeclared = {}
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        extra = _names_read_in(path.read_text()) - ENV_NAMES
        if extra:
            undeclared[str(path.relative_to(ROOT))] = sorted(extra)
    assert undeclared == {}


def test_the_check_sees_a_read() -> None:
    source = 'import os\nos.environ.get("GATEWAY_NOPE")\nos.environ["REDIS_URL"]\n'
    assert _names_read_in(source) == {"GATEWAY_NOPE", "REDIS_URL"}


def test_the_reference_page_documents_every_variable_and_no_other() -> None:
    page = reference().configuration_page()
    sections = re.findall(r"^### `([A-Z0-9_]+)`", page, re.MULTILINE)
    assert sorted(sections) == sorted(ENV_NAMES)
    for v in VARIABLES:
        body = page.split(f"### `{v.name}`", 1)[1].split("\n##", 1)[0]
        assert v.doc.split("(")[0].strip() in body, v.name
    empty_ttl = page.split("### `GATEWAY_EMPTY_TTL_SECONDS`", 1)[1].split("\n##", 1)[0]
    assert "Default: `30`. Values: 0.1 to 86400 seconds." in empty_ttl
    assert "`standalone`, `cluster`, `sentinel`" in page


def test_the_reference_links_resolve_from_its_folder() -> None:
    page = reference().configuration_page()
    for target in re.findall(r"\]\(([^)#]+)", page):
        if not target.startswith(("http:", "https:")):
            resolved = (ROOT / "docs" / "reference" / target).resolve()
            assert resolved.is_file(), target
