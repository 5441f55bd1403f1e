"""`${VAR}` interpolation in deployment TOML: inside strings only, escaped for the string, errors with file:line."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.config import ConfigError
from server.switchyard import interpolation


def interp(text: str, env: dict[str, str], path: str = "deploy.toml") -> str:
    return interpolation.interpolate(text, Path(path), env)[0]


# ---- interpolation ------------------------------------------------------------------------


def test_variables_are_replaced_inside_strings_only():
    text = (
        "# a comment mentioning ${HOST} stays as written\n"
        'url = "http://${HOST}/v1"  # and ${HOST} here too\n'
        "window = ${WINDOW}\n"
        "name = '${HOST}'\n"
    )
    out = interp(text, {"HOST": "h:1", "WINDOW": "9"})
    assert out == (
        "# a comment mentioning ${HOST} stays as written\n"
        'url = "http://h:1/v1"  # and ${HOST} here too\n'
        "window = ${WINDOW}\n"
        "name = 'h:1'\n"
    )


def test_a_hash_or_escaped_quote_inside_a_string_does_not_end_it():
    text = 'a = "x#${A}"\nb = "say \\"${B}\\" ok"\n'
    doc = tomllib.loads(interp(text, {"A": "1", "B": "2"}))
    assert doc == {"a": "x#1", "b": 'say "2" ok'}


def test_default_applies_when_unset_or_empty_but_not_when_set():
    text = 'a = "${A:-dflt}"\nb = "${B:-dflt}"\nc = "${C:-dflt}"\nd = "${D:-}"\ne = "${E}"\n'
    doc = tomllib.loads(interp(text, {"B": "", "C": "given", "E": ""}))
    # `:-` treats set-but-empty like unset (shell semantics); plain ${E} keeps the empty value.
    assert doc == {"a": "dflt", "b": "dflt", "c": "given", "d": "", "e": ""}


def test_values_are_escaped_for_the_string_they_land_in():
    value = 'quote " backslash \\ newline \n tab \t bell \x07 end'
    text = 'a = "${V}"\nb = """\nmulti ${V}"""\n'
    doc = tomllib.loads(interp(text, {"V": value}))
    assert doc["a"] == value
    assert doc["b"] == "multi " + value


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_any_value_round_trips_through_a_basic_string(value):
    assert tomllib.loads(interp('k = "${V}"\n', {"V": value}))["k"] == value


def test_a_literal_string_cannot_take_a_quote_and_says_where():
    with pytest.raises(ConfigError) as err:
        interp("\n\nname = 'x${V}'\n", {"V": "it's"}, path="/etc/d.toml")
    assert "/etc/d.toml:3" in str(err.value) and "V" in str(err.value)


def test_unset_variable_names_the_variable_the_file_and_the_line():
    text = 'a = """\nline one\nline two"""\n# ${NOT_THIS_ONE}\nurl = "http://${HOST}/v1"\n'
    with pytest.raises(ConfigError) as err:
        interp(text, {}, path="/work/dep.toml")
    message = str(err.value)
    assert message.startswith("/work/dep.toml:5: variable HOST is not set")
    assert "NOT_THIS_ONE" not in message


def test_unset_variable_in_a_multiline_string_reports_its_own_line():
    with pytest.raises(ConfigError, match=r"d.toml:3: variable X"):
        interp('a = """\none\ntwo ${X}"""\n', {}, path="d.toml")


def test_multiline_string_may_end_with_quotes():
    doc = tomllib.loads(interp('a = """say "${V}"""""\n', {"V": "hi"}))
    assert doc["a"] == 'say "hi""'


def test_unterminated_string_is_an_error_with_its_line():
    with pytest.raises(ConfigError, match=r"d.toml:2: unterminated string"):
        interp('a = "ok"\nb = "open\nc = "x"\n', {}, path="d.toml")


def test_references_list_string_variables_with_defaults_and_lines():
    text = '# ${IN_COMMENT}\nurl = "${URL:-http://x/v1}"\nmodel = "${MODEL}"\nn = ${NUMBER}\n'
    found = interpolation.references(text, Path("d.toml"))
    assert [(v.name, v.default, v.line, v.required) for v in found] == [
        ("URL", "http://x/v1", 2, False),
        ("MODEL", None, 3, True),
    ]
