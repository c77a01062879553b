"""Counter definitions: good files load, and every bad file names the file, the counter and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas import registry
from schemas.bounded import FileTooLargeError, read_text_at_most
from schemas.definitions import load_definitions, parse_definitions
from schemas.errors import DefinitionError

GOOD = """
[[counter]]
name = "shares_traded"
topics = ["trades"]
kind = "sum"
key = ["symbol"]
value = "qty"
event_id = "trade_id"
where = { side = "buy" }

[[counter]]
name = "notional_by_user"
topics = ["trades", "fills"]
kind = "sum"
number = "decimal"
key = ["symbol", "user.id"]
value = "price"
where = { side = ["buy", "sell"], user.tier = "pro" }
bucket = { field = "ts", size = "1h" }

[[counter]]
name = "visitors"
topics = ["clicks"]
kind = "distinct"
value = "user"
lg_k = 14

[[counter]]
name = "latency"
topics = ["clicks"]
kind = "quantiles"
value = "ms"
k = 400

[[counter]]
name = "top_pages"
topics = ["clicks"]
kind = "top_k"
value = "page"
max_map_size = 64
top = 5
"""


def _counter(body: str) -> str:
    return f'[[counter]]\nname = "c"\ntopics = ["t"]\n{body}\n'


def test_good_file_loads_with_indexes_and_defaults(tmp_path: Path) -> None:
    """A valid file gives counters in order, sorted topics, per-topic lookup and per-kind defaults."""
    path = tmp_path / "counters.toml"
    path.write_text(GOOD, encoding="utf-8")
    cs = load_definitions(path)
    assert [c.name for c in cs.counters] == [
        "shares_traded",
        "notional_by_user",
        "visitors",
        "latency",
        "top_pages",
    ]
    assert cs.topics == ("clicks", "fills", "trades")
    assert [c.name for c in cs.for_topic("trades")] == ["shares_traded", "notional_by_user"]
    assert cs.for_topic("nope") == ()
    assert cs.get("missing") is None
    shares = cs.get("shares_traded")
    assert shares is not None
    assert shares.spec.number == "integer"
    notional = cs["notional_by_user"]
    assert notional.where == {"side": ("buy", "sell"), "user.tier": ("pro",)}
    assert notional.bucket is not None
    assert notional.bucket.seconds == 3600
    assert cs["visitors"].spec.lg_k == 14
    assert cs["latency"].spec.k == 400
    assert (cs["top_pages"].spec.lg_max_map_size, cs["top_pages"].spec.top) == (6, 5)


def test_key_may_be_a_single_string_and_topics_a_single_topic() -> None:
    """``key = "symbol"`` means one key field; a count needs no value."""
    c = parse_definitions('[[counter]]\nname = "n"\ntopics = "t"\nkind = "count"\nkey = "symbol"\n')["n"]
    assert (c.key, c.topics, c.value) == (("symbol",), ("t",), None)


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ('kind = "sum"', "value", "needs a value field"),
        ('kind = "count"\nvalue = "x"', "value", "does not read a value"),
        ('kind = "sum"\nvalue = "x"\nlg_k = 12', "lg_k", "does not apply to kind sum"),
        ('kind = "distinct"\nvalue = "x"\nnumber = "float"', "number", "does not apply"),
        ('kind = "distinct"\nvalue = "x"\nlg_k = 30', "lg_k", "less than or equal to 21"),
        ('kind = "top_k"\nvalue = "x"\nmax_map_size = 100', "max_map_size", "power of two"),
        ('kind = "median"\nvalue = "x"', "kind", "Input should be"),
        ('kind = "sum"\nvalue = "x"\nnumber = "money"', "number", "Input should be"),
        ('kind = "sum"\nvalue = "a..b"', "value", "not a field path"),
        ('kind = "count"\nkey = ["a", "a"]', "key", "listed twice"),
        ('kind = "count"\nwhere = { side = 1.5 }', "where", "not a string, integer or boolean"),
        ('kind = "count"\nwhere = { side = [] }', "where", "lists no values"),
        ('kind = "count"\nbucket = { field = "ts", size = "7h" }', "bucket.size", "divide a day"),
        ('kind = "count"\nbucket = { field = "ts", size = "1w" }', "bucket.size", "like 1m"),
        ('kind = "count"\nbucket = { field = "ts", size = "1h", format = "rfc" }', "bucket.format", "Input"),
        ('kind = "count"\ncolour = "red"', "colour", "Extra inputs are not permitted"),
        # Options as written: no guessing that "12" is 12 or "no" is false.
        ('kind = "distinct"\nvalue = "x"\nlg_k = "12"', "lg_k", "valid integer"),
        ('kind = "quantiles"\nvalue = "x"\nk = 200.0', "k", "valid integer"),
        ('kind = "top_k"\nvalue = "x"\ntop = true', "top", "valid integer"),
        ('kind = "sum"\nvalue = "x"\ncoerce = "no"', "coerce", "valid boolean"),
        ('kind = "sum"\nvalue = "x"\nrequired = 1', "required", "valid boolean"),
        # A frequent-items sketch tracks 3/4 of its map: more could never be reported.
        ('kind = "top_k"\nvalue = "x"\ntop = 193', "top", "192 items a max_map_size of 256 tracks"),
        ('kind = "top_k"\nvalue = "x"\ntop = 1000\nmax_map_size = 1024', "top", "at least 2048"),
    ],
)
def test_bad_counter_names_file_counter_and_field(body: str, field: str, reason: str) -> None:
    """Each bad counter is refused with a DefinitionError naming the file, the counter and the field."""
    with pytest.raises(DefinitionError) as info:
        parse_definitions(_counter(body), source="counters.toml")
    err = info.value
    assert (err.source, err.counter, err.field) == ("counters.toml", "'c' (#1)", field)
    assert reason in err.reason
    assert str(err).startswith("counters.toml: counter 'c' (#1), field")


@pytest.mark.parametrize("name", ["Shares", "1st", "a-b", "x" * 49, ""])
def test_bad_counter_name_is_refused(name: str) -> None:
    """Counter names must be lower-case identifiers of at most 48 characters (they reach CQL)."""
    with pytest.raises(DefinitionError) as info:
        parse_definitions(f'[[counter]]\nname = "{name}"\ntopics = ["t"]\nkind = "count"\n', "f.toml")
    assert info.value.field == "name"


def test_counter_without_a_name_is_named_by_index() -> None:
    """A counter with no usable name is identified by its position in the file."""
    text = _counter('kind = "count"') + '[[counter]]\ntopics = ["t"]\nkind = "count"\n'
    with pytest.raises(DefinitionError) as info:
        parse_definitions(text, "f.toml")
    assert (info.value.counter, info.value.field) == ("#2", "name")


def test_duplicate_names_are_refused() -> None:
    """Two counters with one name are refused, naming the second."""
    text = _counter('kind = "count"') + _counter('kind = "count"')
    with pytest.raises(DefinitionError) as info:
        parse_definitions(text, "f.toml")
    assert (info.value.counter, info.value.field) == ("'c' (#2)", "name")
    assert "duplicate" in info.value.reason


def test_bad_topic_is_refused() -> None:
    """Topic names follow Kafka's rules."""
    with pytest.raises(DefinitionError) as info:
        parse_definitions('[[counter]]\nname = "c"\ntopics = ["a b"]\nkind = "count"\n', "f.toml")
    assert info.value.field == "topics"


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("[[counter]\n", "", "not valid TOML"),
        ("", "counter", "defines no [[counter]]"),
        ('title = "x"\n', "title", "unknown top-level"),
    ],
)
def test_bad_file_is_refused(text: str, field: str, reason: str) -> None:
    """Unparseable, empty or foreign files are refused with the file named."""
    with pytest.raises(DefinitionError) as info:
        parse_definitions(text, "f.toml")
    assert (info.value.source, info.value.field) == ("f.toml", field)
    assert reason in info.value.reason


def test_missing_file_is_a_definition_error(tmp_path: Path) -> None:
    """An unreadable file is a DefinitionError naming the path."""
    with pytest.raises(DefinitionError) as info:
        load_definitions(tmp_path / "absent.toml")
    assert info.value.source.endswith("absent.toml")


def test_definitions_are_frozen() -> None:
    """A definition cannot be changed in place: a changed meaning is a new counter."""
    c = parse_definitions(GOOD)["shares_traded"]
    with pytest.raises(ValueError, match="frozen"):
        c.value = "other"  # type: ignore[misc]


def test_a_definitions_or_schema_file_without_end_is_refused_after_its_bound(tmp_path: Path) -> None:
    """A device or a pipe reports size 0 and may never end (/dev/zero): the definitions file and a topic's
    schema file are read up to their bound and refused past it, instead of filling the memory."""
    with pytest.raises(DefinitionError, match=r"cannot read the file: /dev/zero holds more than 16,777,216 bytes"):
        load_definitions("/dev/zero")
    path = tmp_path / "counters.toml"
    path.write_text('[[topic]]\nname = "t"\nformat = "avro"\nschema_file = "/dev/zero"\n'
                    '[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "count"\nkey = ["k"]\n')
    with pytest.raises(DefinitionError, match=r"cannot read schema file /dev/zero: /dev/zero holds more than "
                                              r"262,144 bytes"):
        load_definitions(path)
    limit = tmp_path / "limit.txt"
    limit.write_bytes(b"x" * 10)
    assert read_text_at_most(limit, 10) == "x" * 10
    with pytest.raises(FileTooLargeError, match="holds more than 9 bytes"):
        read_text_at_most(limit, 9)


def test_a_topic_table_s_problems_name_the_table_and_the_field() -> None:
    """A misspelt [[topic]] field names itself and the nearest field, a wrong value pydantic's words for it,
    one line each, never a raw validation dump; topic names Kafka refuses or keeps for itself are refused."""
    text = ('[[topic]]\nname = "t"\nformat = "avro"\nshcema_file = "x.avsc"\n'
            '[[topic]]\nname = "u"\nformat = "xml"\n'
            '[[topic]]\nname = ".."\n'
            '[[counter]]\nname = "c"\ntopics = ["t", "__consumer_offsets"]\nkind = "count"\nkey = ["k"]\n')
    with pytest.raises(DefinitionError) as refused:
        parse_definitions(text, "c.toml")
    lines = [problem.line for problem in refused.value.problems]
    assert lines[0] == ("c.toml: [[topic]] 't' (#1), field 'shcema_file': not a field of [[topic]] (did you mean "
                        "schema_file?); its fields are format, message, name, reader_schema_file, schema_file, "
                        "validate")
    assert lines[1] == ("c.toml: [[topic]] 'u' (#2), field 'format': Input should be 'json', 'avro', 'protobuf' or "
                        "'json-schema'")
    assert lines[2] == "c.toml: [[topic]] '..' (#3), field 'name': '..' is not a Kafka topic name"
    assert lines[3] == "c.toml: counter 'c' (#1), field 'topics': '__consumer_offsets' is one of Kafka's own topics"
    assert len(lines) == 4
    assert not any("errors.pydantic.dev" in line for line in lines)


def test_a_file_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Some editors save UTF-8 with a byte-order mark, which TOML does not allow: it is read past."""
    path = tmp_path / "counters.toml"
    path.write_bytes(b"\xef\xbb\xbf" + b'[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "count"\nkey = ["k"]\n')
    assert [c.name for c in load_definitions(path)] == ["c"]


def test_top_within_what_the_map_tracks_is_read_and_a_recorded_definition_is_read_whatever_its_top() -> None:
    """top up to 3/4 of max_map_size is taken; a definition the counter registry recorded before that check is
    read back from its record (its consumer refuses the file instead), and its top kept."""
    body = 'kind = "top_k"\nvalue = "x"\n'
    assert parse_definitions(_counter(body + "top = 192"), source="f")["c"].top == 192
    assert parse_definitions(_counter(body + "top = 1000\nmax_map_size = 2048"), source="f")["c"].top == 1000
    recorded = '{"name":"c","topics":["t"],"kind":"top_k","key":["s"],"value":"x","top":1000}'
    assert registry.from_record(recorded).top == 1000


def test_a_copy_with_other_fields_works_out_its_own_derived_values() -> None:
    """A definition keeps the values it derives from its fields (the bucket's width, the retention in seconds,
    the kind's spec) once asked; a copy with other fields must not answer with the original's."""
    original = parse_definitions('[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "top_k"\nvalue = "page"\ntop = 5\n'
                                 'bucket = { field = "ts", size = "1h" }\nretain = "2d"\n')["c"]
    assert (original.retain_seconds, original.bucket and original.bucket.seconds, original.spec.top) == (
        2 * 86400, 3600, 5)
    assert original.bucket is not None
    copied = original.model_copy(update={"retain": "3d", "top": 7,
                                         "bucket": original.bucket.model_copy(update={"size": "1d"})})
    assert copied.retain_seconds == 3 * 86400
    assert copied.spec.top == 7
    assert copied.bucket is not None
    assert copied.bucket.seconds == 86400
    assert original.retain_seconds == 2 * 86400
    assert original.bucket.seconds == 3600


@pytest.mark.parametrize(("where", "reason"), [
    ('{ a.b = "x", "a.b" = "y" }', "where names a.b twice"),
    ('{ "a.b" = "y", a = { b = "x" } }', "where names a.b twice"),
    ("{ a = {} }", "where.a is a table of no entries"),
    ("{ a.b = {} }", "where.a.b is a table of no entries"),
])
def test_a_filter_that_would_lose_an_entry_is_refused(where: str, reason: str) -> None:
    """A dotted key and a quoted one name one field (TOML keeps both), and an empty table filters nothing: either
    dropped an entry of the file silently (the last of the two won; the empty table was no filter)."""
    with pytest.raises(DefinitionError, match=reason):
        parse_definitions(f'[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "count"\nwhere = {where}\n')
