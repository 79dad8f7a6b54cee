"""The pure-Python strict validation (`keyshift.processing.operators.strict_records`) against Spark's
`validate_records(frame, spec, canonical_fast_path=False)`, row by row, for the flights and the
YSB spec: the oracle corpus of test_records.py, the edge cases of the strict_records module
docstring, and a seeded corpus of mutated records (real Spark, one DataFrame per spec)."""

import dataclasses
import json
import random

import pytest
from test_records import CASES, FAST_PATH_CASES

from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.jobs.ysb import YSB
from keyshift.topics import end_of_input_marker
from keyshift.processing.operators.records import FILTERED, MALFORMED_JSON, NOT_AN_OBJECT, record_columns, validate_records
from keyshift.processing.operators.strict_records import control_marker, java_utf8_decode, strict_record

YSB_ALL = dataclasses.replace(YSB, keep=None)  # the fields Spark parses for YSB's filtered records
SPECS = {"flights": FLIGHT_DELAYS, "ysb": YSB, "ysb without keep": YSB_ALL}

CANONICAL = '{"event_id":7,"origin":"ORD","destination":"LGA","delay_min":-12,"distance_mi":733,"event_time":978307260000}'
FLIGHT = CANONICAL.encode()
YSB_EVENT = json.dumps({"event_id": 0, "user_id": "u-1", "page_id": "p-1", "ad_id": "ad-1", "ad_type": "banner",
                        "event_type": "view", "event_time": 1764000000000, "ip_address": "1.2.3.4"}).encode()


def extra(record: bytes, member: bytes) -> bytes:
    """`record` (a JSON object) with one more member text before its closing brace."""
    return record[:-1] + b"," + member + b"}"


EDGE_VALUES = [
    # top-level values: Jackson's root rules decide malformed JSON against not a JSON object
    b"012", b"-", b"-0", b"1 2", b"1x", b"1,", b"1]", b"1\x00", b"1.", b".5", b"1e", b"-01", b"1e5 ", b"-1.5e3\n",
    b"true x", b"truex", b"true_", b"true$", b"true0", b"true]", "true\u00e9".encode(), "true\U0001F600".encode(),
    "null\u00b7".encode(), "false\u200b".encode(), b"null,", b'"a" x', b"[1] x", b"[1]x", b"NaN", b"-Infinity",
    # objects followed by more text: Spark reads the first value, records._reason checks the end
    b'{"a":1}garbage', b"{} }", b"{}}", b'{"a":1} x}', FLIGHT + b" }", FLIGHT + b"{}", FLIGHT + b" [1]", FLIGHT + b"\x00",
    # duplicates at any depth, names compared unescaped
    b'{"a":{"b":1,"b":2}}', b'{"a":[{"b":1,"b":2}]}', b'[{"b":1,"b":2}]', b'{"a":1,"\\u0061":2}', extra(FLIGHT, b'"x":{"y":[1,{"z":1,"z":1}]}'),
    # surrogates: lone ones malformed anywhere, escaped pairs valid
    b'{"a":"\\ud800"}', b'{"\\ud800":1}', b'{"a":["\\udc00"]}', b'"\\ud800"', b'{"a":"\\ud83d\\u0041"}', b'{"a":"\\udE00\\ud83d"}',
    extra(FLIGHT, b'"x":"\\ud83d\\ude00"'), extra(FLIGHT, b'"x":"\\uD83D\\uDE00"'), extra(FLIGHT, b'"\\ud83d\\ude00":1'),
    FLIGHT.replace(b'"LGA"', b'"\\ud83d\\ude00"'), FLIGHT.replace(b'"LGA"', b'"L\\u0000A"'),
    # control characters, escapes, byte order mark, whitespace that is not JSON's
    b'{"a":"\x01"}', b'{"a":"\x7f"}', b'{"a":"\\x"}', b'{"a":"\\u+123"}', b'{"a":"\\u 123"}', b'{"a":"\\u1_23"}', b"{'a':1}",
    b"\xef\xbb\xbf" + FLIGHT, b"\x0c" + FLIGHT, "\u00a0".encode() + FLIGHT, FLIGHT + "\u2028".encode(), b"\xef\xbb\xbf",
    # raw bytes that are not UTF-8 (overlong forms, encoded surrogates, beyond U+10FFFF) or are
    b"\xc0\x80", b'{"a":"\xed\xa0\x80"}', b'{"a":"\xf4\x90\x80\x80"}', b'{"a":"\xe0\x80\x80"}', b'{"a":"\xf8\x88\x80\x80\x80"}',
    b'{"a":"\xc1\xbf"}', b'{"a":"\xef\xbf\xbe"}', b'{"a":"\xf4\x8f\xbf\xbf"}', b"\xff  ",
    # numbers: Jackson's 1000-digit limit, the 64-bit range, integers only for longs
    FLIGHT.replace(b"-12", b"1" * 1000), FLIGHT.replace(b"-12", b"1" * 1001), extra(FLIGHT, b'"x":' + b"1" * 1000),
    extra(FLIGHT, b'"x":' + b"1" * 1001), extra(FLIGHT, b'"x":' + b"7" * 5000), extra(FLIGHT, b'"x":-' + b"1" * 1000),
    extra(FLIGHT, b'"x":0.' + b"1" * 999), extra(FLIGHT, b'"x":0.' + b"1" * 1000), extra(FLIGHT, b'"x":1e' + b"1" * 999),
    extra(FLIGHT, b'"x":1e-' + b"1" * 1000), extra(FLIGHT, b'"x":1.' + b"1" * 998 + b"e11"), b"1" * 1000, b"1" * 1001,
    # ... where Jackson's slow path (a float starting with 0, a root float reaching the end of the
    # text) counts an absent fraction or exponent as -1 digit
    *[number for token in (b"0." + b"1" * 1000, b"0." + b"1" * 1001, b"1." + b"1" * 999, b"1." + b"1" * 1000, b"0e" + b"1" * 1000,
                           b"0e" + b"1" * 1001, b"-0." + b"1" * 1000, b"-0." + b"1" * 1001, b"0." + b"1" * 999 + b"e1",
                           b"0.0e" + b"1" * 998, b"0E-" + b"1" * 1000, b"12." + b"1" * 999, b"-12." + b"1" * 998 + b"E+1")
      for number in (extra(FLIGHT, b'"x":' + token), token, token + b" ", b"[" + token + b"]")],
    FLIGHT.replace(b"-12", b"-9223372036854775808"), FLIGHT.replace(b"-12", b"-9223372036854775809"),
    FLIGHT.replace(b"-12", b"-0.0"), FLIGHT.replace(b"-12", b"0e0"), FLIGHT.replace(b"-12", b"true"), extra(FLIGHT, b'"x":1e400'),
    # nesting: Jackson's depth limit of 1000 levels, root included (objects nested some 800 deep
    # overflow the stack of Spark's schema_of_variant in a cold JVM, which then exits: kept at 500)
    extra(FLIGHT, b'"x":' + b"[" * 999 + b"]" * 999), extra(FLIGHT, b'"x":' + b"[" * 1000 + b"]" * 1000),
    extra(FLIGHT, b'"x":' + b'{"a":' * 500 + b"1" + b"}" * 500), extra(FLIGHT, b'"x":' + b"[" * 2000 + b"]" * 2000),
    b"[" * 1000 + b"]" * 1000, b"[" * 1001 + b"]" * 1001, b"[" * 2000, FLIGHT + b"[" * 2000,
    # names: Jackson's 50,000 UTF-16 code units, counted after unescaping
    extra(FLIGHT, b'"' + b"k" * 50000 + b'":1'), extra(FLIGHT, b'"' + b"k" * 50001 + b'":1'),
    extra(FLIGHT, b'"' + "\U0001F600".encode() * 25000 + b'":1'), extra(FLIGHT, b'"' + "\U0001F600".encode() * 25001 + b'":1'),
    extra(FLIGHT, b'"' + b"\\u0041" * 50001 + b'":1'), extra(FLIGHT, b'"' + "\u00e9".encode() * 50000 + b'":1'),
    # the value rules: trim removes U+0020 only, the byte limit counts UTF-8 bytes
    FLIGHT.replace(b'"LGA"', b'"\t"'), FLIGHT.replace(b'"LGA"', b'" \\t "'), FLIGHT.replace(b'"LGA"', "\"\u3000\"".encode()),
    FLIGHT.replace(b'"LGA"', b'"   "'), FLIGHT.replace(b'"LGA"', b'"' + "\u00e9".encode() * 512 + b'"'),
    FLIGHT.replace(b'"LGA"', b'"' + "\u00e9".encode() * 513 + b'"'), FLIGHT.replace(b'"LGA"', b'"' + "\U0001F600".encode() * 257 + b'"'),
    # from_json's corrupt-record column and case-insensitive names do not reach the result
    extra(FLIGHT, b'"_corrupt_record":"x"'), extra(FLIGHT, b'"_corrupt_record":5'), extra(FLIGHT, b'"Origin":"XYZ"'),
    extra(FLIGHT, b'"EVENT_ID":"x"'),
    # YSB's keep rule
    YSB_EVENT, YSB_EVENT.replace(b'"view"', b'"click"'), YSB_EVENT.replace(b'"view"', b'"View"'), YSB_EVENT.replace(b'"view"', b'" view"'),
    YSB_EVENT.replace(b'"view"', b'"vi\\u0065w"'), YSB_EVENT.replace(b'"view"', b'""'), YSB_EVENT.replace(b'"ad-1"', b'" "'),
    YSB_EVENT.replace(b'"u-1"', b'""'), YSB_EVENT.replace(b'"view"', b'"click"').replace(b": 0,", b": -1,"),
]

EDGE_KEYS = [None, b"", b"ORD", b"ORD ", b"\xff", b"\xef\xbf\xbd", b"\xc3\x28", b"\xed\xa0\x80", b"\xed\xa0", b"\xed\xa0x",
             b"\xf0\x9f\x98", b"\xe0\x80\x80", b"\xc0\x80", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"a\xe2\x82",
             b"\xe2\x82a", b"\xef\xbf\xbe", b"\xe0\xa0", b"\xf0\x80\x80\x80", b"\xed\xbf\xbf\xed\xa0\x80x", b"\xfe\xff",
             b"\x80\x80", b"\xed\x9f\xbf", b"\xed\xbf\xbf\xbf", b"\t", "\u00e9".encode()]
EDGE_KEYED = ([(key, FLIGHT) for key in EDGE_KEYS] + [(key, YSB_EVENT) for key in EDGE_KEYS]
              + [(b"\xff", FLIGHT.replace(b'"ORD"', "\"\ufffd\"".encode())), (b"\xef\xbf\xbd", FLIGHT.replace(b'"ORD"', "\"\ufffd\"".encode())),
                 (b"\t", FLIGHT.replace(b'"ORD"', b'"\\t"')), (b"\x00", FLIGHT.replace(b'"ORD"', b'"\\u0000"')),
                 ("\U0001F600".encode(), FLIGHT.replace(b'"ORD"', b'"\\ud83d\\ude00"'))])

MARKER = '{"control": "end_of_input"'
MARKERS = [end_of_input_marker("run-1", 5_000), end_of_input_marker("r\u00e9\n\"x", 0), end_of_input_marker("", -5)] + [(MARKER + m).encode() for m in (
    ', "run_id": 5, "event_time": "5000"}', ', "run_id": {"a": [1, 2.50, "x"]}, "event_time": 5000.0}', ', "run_id": null, "event_time": null}', "}",
    ', "run_id": "a", "run_id": "b", "event_time": 1, "event_time": 2}', ', "run_id": null, "run_id": "b", "event_time": 1, "event_time": null}',
    ', "run_id": "a", "event_time": 5000, "x": NaN}', ', "run_id": "a", "event_time": 5000} garbage', ', "run_id": "a", "event_time": 5000',
    ', "run_id": "a", "event_time": 5e3}', ', "run_id": "a", "event_time": 9223372036854775808}', ', "run_id": true, "event_time": 012}',
    ', "run_id": [1,2], "event_time": 1}', ', "run_id": "a", "event_time": true}', ', "run_id": "\\ud800", "event_time": 1}',
    ', "run_id": 1.50, "event_time": 1}', ', "run_id": 1e5, "event_time": 1}', ', "run_id": -0.0, "event_time": 1}', ', "run_id": -0, "event_time": 1}',
    ', "run_id": [1e400, -1e400, 1e7, 1e-3, 1e-4, 9999999.0, 123456789012.5, 18446744073709551616], "event_time": 1}',
    ', "run_id": {"b" :  1 , "c":null}, "event_time": 1}', ', "RUN_ID": "a", "Event_Time": 1}', ", 'run_id': 'it\\'s', 'event_time': 7}",
    ', "run_id": "a\tb", "event_time": 1}', ',"x":{"event_time":3},"event_time":1}', ', "run_id": "a", "event_time": 1, "event_time": "x"}',
    ', "run_id": "a", "event_time": "x", "event_time": 2}', ', "run_id": "a", "event_time": {"v": 1}, "event_time": 3}',
    ', "run_id": "a", "event_time": 4, "x": NaN, "y": -Infinity, "z": +INF, "w": -INF, "v": Infinity, "u": +Infinity}',
    ', "run_id": "a", "event_time": 4, "x": INF}', ', "run_id": "a", "event_time": 4, "x": +1}', ', "run_id": "a", "event_time": 4, "\x01": 1}',
    ', "run_id": ["\\ud800"], "event_time": 4}', ', "run_id": "ok", "event_time": 4, "x": "\\ud800"}', ', "run_id": "a", "event_time": 5, }',
    ', "run_id": {"a\\u0001\\b\\t\\n\\f\\r\\u001f\\"\\\\/x\u00e9\\u00e9\\ud83d\\ude00": "\x01\x1f\x7f"}, "event_time": 1}',
    ', "run_id": "a\U0001F600\\ud83d\\ude00", "event_time": 1}', ', "run_id": "a", "event_time": 1,"d":' + "[" * 1001 + "]" * 1001 + "}",
    ', "run_id": "a", "event_time": 1,"d":' + "[" * 999 + "]" * 999 + "}", ', "run_id": 1' + "0" * 1000 + ', "event_time": 1}',
)]

MUTANT_COUNT = 3200

CODES = ["ORD", "LGA", "ATL", "SFO", "S\u00e3o", "\u6771\u4eac", "A", "\U0001F6EB"]
CHARS = list('{}[]":,\\ -+.0123456789eEtrufalsnNI\'x\t\n\r\x00\x01\x1f\x7f') + ["\u00e9", "\u00a0", "\u2028", "\ufeff", "\U0001F600", "\ufffd"]
BAD_BYTES = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc3", b"\x80", b"\xe2\x82"]


class Raw(str):
    """A value rendered verbatim (a token json.dumps would never write)."""


VALUES = [Raw("1e1"), Raw("-0"), Raw("-12.0"), Raw("012"), Raw("1."), Raw("NaN"), Raw("-Infinity"), Raw("9223372036854775807"),
          Raw("9223372036854775808"), Raw("-9223372036854775809"), Raw('"\\ud800"'), Raw('"\\ud83d\\ude00"'), Raw('"\\u0000"'),
          Raw('"\\u004fRD"'), Raw("1" * 25), Raw("[" * 3 + "]" * 3), True, False, None, [], {}, {"code": "ORD"}, [1, 2], "", " ", "  ",
          "\t", " x ", "A" * 1024, "A" * 1025, "\u00e9" * 512, "\u00e9" * 513, -1, -5, 0, 1.5, "12", "ORD", "LGA", "view", "click", 7]
NAMES = ["comment", "x", "_corrupt_record", "Origin", "EVENT_ID", "a\u0000", "\u00e9", "", "event_id", "origin", "event_type"]


def flight(rng: random.Random) -> dict:
    return {"event_id": rng.randrange(0, 10**6), "origin": rng.choice(CODES), "destination": rng.choice(CODES),
            "delay_min": rng.randint(-60, 1700), "distance_mi": rng.randrange(0, 5000), "event_time": rng.randrange(970_000_000_000, 990_000_000_000)}


def ysb(rng: random.Random) -> dict:
    return {"event_id": rng.randrange(0, 10**6), "user_id": f"u-{rng.randrange(99)}", "page_id": f"p-{rng.randrange(99)}",
            "ad_id": f"ad-{rng.randrange(9)}", "ad_type": rng.choice(["banner", "modal"]), "event_type": rng.choice(["view", "view", "click", "purchase"]),
            "event_time": rng.randrange(1_764_000_000_000, 1_765_000_000_000), "ip_address": "1.2.3.4"}


def escaped(rng: random.Random, text: str) -> str:
    """A JSON string literal of `text`, some characters as \\u escapes (astral ones as pairs)."""
    out = []
    for c in text:
        if rng.random() < 0.2:
            code = ord(c)
            if code > 0xFFFF:
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04X}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(json.dumps(c, ensure_ascii=rng.random() < 0.3)[1:-1])
    return '"' + "".join(out) + '"'


def render(rng: random.Random, value, depth: int = 0) -> str:
    """A JSON text of `value` in a random valid form (whitespace, escapes); `Raw` verbatim; an
    object given as a list of pairs may repeat a name."""
    ws = lambda: rng.choice(["", "", "", " ", "\n", "\t", "\r\n", "  "])  # noqa: E731
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, str):
        return escaped(rng, value) if rng.random() < 0.15 else json.dumps(value, ensure_ascii=rng.random() < 0.3)
    if isinstance(value, dict):
        if not value:
            return "{" + ws() + "}"
        value = list(value.items())
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return "{" + ws() + ("," + ws()).join(f"{render(rng, k)}{ws()}:{ws()}{render(rng, v, depth + 1)}{ws()}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(ws() + render(rng, v, depth + 1) + ws() for v in value) + "]"
    return json.dumps(value)


def mutate_record(rng: random.Random, pairs: list) -> list:
    """One structural change of a record given as a list of (name, value) pairs."""
    i = rng.randrange(len(pairs))
    name, value = pairs[i]
    op = rng.randrange(9)
    if op == 0:
        del pairs[i]
    elif op == 1:
        pairs[i] = (name, rng.choice(VALUES))
    elif op == 2:
        pairs.insert(rng.randrange(len(pairs) + 1), (rng.choice(NAMES), rng.choice(VALUES)))
    elif op == 3:
        pairs.insert(rng.randrange(len(pairs) + 1), (name, rng.choice([value, rng.choice(VALUES)])))  # a duplicate
    elif op == 4:
        pairs[i] = (name, rng.choice([[value], {"v": value}, [("a", 1), ("a", value)]]))  # nested, maybe a nested duplicate
    elif op == 5:
        rng.shuffle(pairs)
    elif op == 6:
        depth = rng.choice([5, 998, 999, 1000])
        pairs.insert(rng.randrange(len(pairs) + 1), ("deep", Raw("[" * depth + "]" * depth)))
    elif op == 7 and isinstance(value, int) and not isinstance(value, bool):
        pairs[i] = (name, -value if value else -1)
    elif op == 8 and isinstance(value, str):
        pairs[i] = (name, rng.choice([value + " ", " " + value, value.lower(), "", "  ", value * 400]))
    return pairs


def mutate_text(rng: random.Random, text: str) -> str:
    """One textual change: insert, delete, replace, swap, truncate, prefix or suffix."""
    at = rng.randrange(len(text) + 1)
    op = rng.randrange(8)
    if op == 0:
        return text[:at] + rng.choice(CHARS) + text[at:]
    if op == 1:
        return text[:at] + text[at + rng.randint(1, 3):]
    if op == 2:
        return text[:at] + rng.choice(CHARS) + text[at + 1:]
    if op == 3 and at + 1 < len(text):
        return text[:at] + text[at + 1] + text[at] + text[at + 2:]
    if op == 4:
        return text[:at]
    if op == 5:
        return rng.choice([" ", "\n", "\ufeff", "\x00", "[", "{", "\u00a0", "1"]) + text
    if op == 6:
        return text + rng.choice([" ", "\r\n", "}", " }", "x", " x}", "{}", "]", ",", "garbage", " 1", "\t}\n"])
    return text.replace(":", rng.choice([": ", " :", ":\t"]), rng.randint(1, 3))


def mutants(seed: int, count: int) -> list[tuple[bytes | None, bytes | None]]:
    """`count` seeded (key, value) rows: flights, YSB events and markers, mostly mutated."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        kind = rng.choices(["flight", "ysb", "marker"], [45, 45, 10])[0]
        if kind == "marker":
            pairs = [("control", "end_of_input"), ("run_id", f"run-{rng.randrange(9)}"), ("event_time", rng.randrange(10**12))]
        else:
            pairs = list((flight if kind == "flight" else ysb)(rng).items())
        origin = dict(pairs).get("origin", dict(pairs).get("ad_id"))
        for _ in range(rng.choice([0, 0, 1, 1, 1, 2, 3])):
            pairs = mutate_record(rng, pairs) or pairs
        if not pairs:
            pairs = [("x", 1)]
        text = render(rng, pairs)
        if kind == "marker" and rng.random() < 0.7:  # most markers keep the exact prefix
            rest = text.partition("end_of_input")[2].partition('"')[2]
            text = MARKER + rest if rest else text
        for _ in range(rng.choice([0, 0, 0, 0, 1, 1, 2])):
            text = mutate_text(rng, text)
        value = text.encode("utf-8", "surrogatepass")
        if rng.random() < 0.05:
            at = rng.randrange(len(value) + 1)
            value = value[:at] + rng.choice(BAD_BYTES) + value[at:]
        draw = rng.random()
        if isinstance(origin, str) and draw < 0.7:
            key = origin.encode("utf-8", "surrogatepass")
        else:
            key = rng.choice([None, b"", b"ORD", b"ORD ", b"\xff", b"\xed\xa0\x80", b"campaign-1", "S\u00e3o".encode()])
        rows.append((key, value if rng.random() > 0.01 else rng.choice([None, b"", b" \n"])))
    return rows


CORPUS = ([(k, v) for k, v, _ in CASES] + [(k, v) for k, v, _ in FAST_PATH_CASES] + [(b"ORD", v) for v in EDGE_VALUES] + EDGE_KEYED
          + [(b"ORD", v) for v in MARKERS] + mutants(20260501, MUTANT_COUNT))


@pytest.fixture(scope="module")
def spark_rows(spark):
    """Spark's strict validation of the whole corpus under each spec, in corpus order."""
    frame = spark.createDataFrame([(k, v, 3, i) for i, (k, v) in enumerate(CORPUS)], "key BINARY, value BINARY, partition INT, offset LONG")
    frame = frame.cache()
    rows = {name: sorted(validate_records(frame, spec, canonical_fast_path=False).collect(), key=lambda row: row.kafka_offset)
            for name, spec in SPECS.items()}
    frame.unpersist()
    return rows


def differences(spec, rows, filtered_fields=None) -> list[str]:
    """Every row where strict_record/control_marker and Spark disagree, described. A FILTERED
    record's fields are compared with `filtered_fields` (offset -> Spark's fields without keep)."""
    columns = record_columns(spec)
    found = []
    for (key, value), row in zip(CORPUS, rows):
        marker = control_marker(spec, value)
        spark_marker = (row.control_run_id, row.event_time_ms) if row.is_control else None
        if marker != spark_marker:
            found.append(f"marker {value[:120]!r}: python {marker} spark {spark_marker}")
        if row.is_control:  # Spark gives a marker no reason and from_json's fields
            continue
        reason, fields = strict_record(spec, key, value)
        got = {c: row[c] for c in columns}
        nothing = {c: None for c in columns}
        if reason is None:
            same = fields is not None and {c: fields[c] for c in columns} == got
        elif reason == FILTERED:
            same = got == nothing and (filtered_fields is None or {c: fields[c] for c in columns} == filtered_fields[row.kafka_offset])
        else:
            same = fields is None and got == nothing
        if reason != row.dead_letter_reason or not same:
            found.append(f"key {key!r} value {value[:120]!r}: python {reason} {fields} spark {row.dead_letter_reason} {got}")
    return found


def test_the_corpus_is_big_enough():
    assert len(CORPUS) > MUTANT_COUNT >= 3000
    reasons = {strict_record(FLIGHT_DELAYS, k, v)[0] for k, v in CORPUS} | {strict_record(YSB, k, v)[0] for k, v in CORPUS}
    assert {None, FILTERED, MALFORMED_JSON, NOT_AN_OBJECT, "invalid UTF-8", "empty value", "key does not match origin"} <= reasons
    assert len(reasons) > 30


@pytest.mark.parametrize("name", ["flights", "ysb", "ysb without keep"])
def test_strict_record_and_control_marker_match_spark(spark_rows, name):
    """Same reason, same field values, same marker reading as Spark, for every row; a YSB record
    that keep filters out gets the fields Spark parses for it without keep."""
    spec = SPECS[name]
    filtered = {row.kafka_offset: {c: row[c] for c in record_columns(spec)} for row in spark_rows["ysb without keep"]} if spec.keep else None
    found = differences(spec, spark_rows[name], filtered)
    assert not found, f"{len(found)} differences:\n" + "\n".join(found[:30])


def test_java_utf8_decode_is_the_jvm_reading_of_a_key(spark_rows):
    """The YSB key column is the JVM's decoding of the Kafka key: Python's errors='replace'
    differs for encoded surrogates (ED A0 80: one U+FFFD in the JDK, three in Python)."""
    keys = [key for key in EDGE_KEYS if key is not None]
    by_key = {row.raw_key_bytes: row.campaign_id for row in spark_rows["ysb"] if row.raw_key_bytes is not None and row.dead_letter_reason is None}
    assert [java_utf8_decode(k) for k in keys] == [by_key[k] for k in keys]
    assert by_key[b"\xed\xa0\x80"] == "\ufffd" != b"\xed\xa0\x80".decode("utf-8", "replace")


def test_known_differences(spark):
    """Where Python cannot give Spark's answer (strict_records module docstring), pinned down:
    a root literal followed by a letter first assigned in Unicode 14 (U+0870: Python's Unicode
    14 calls it a letter, JDK 17's Unicode 13 does not know it), and a float run id that JDK 17's
    Double.toString prints with more digits than the shortest."""
    rows = [(b"x", "true\u0870".encode(), 0, 0), (b"x", (MARKER + ', "run_id": 2.82879384806159E17, "event_time": 1}').encode(), 0, 1),
            (b"x", (MARKER + ', "run_id": 5e-324, "event_time": 1}').encode(), 0, 2)]
    frame = spark.createDataFrame(rows, "key BINARY, value BINARY, partition INT, offset LONG")
    got = validate_records(frame, FLIGHT_DELAYS, canonical_fast_path=False).orderBy("kafka_offset").collect()
    assert (got[0].dead_letter_reason, strict_record(FLIGHT_DELAYS, b"x", rows[0][1])[0]) == (NOT_AN_OBJECT, MALFORMED_JSON)
    assert (got[1].control_run_id, control_marker(FLIGHT_DELAYS, rows[1][1])[0]) == ("2.82879384806159008E17", "2.82879384806159E17")
    assert (got[2].control_run_id, control_marker(FLIGHT_DELAYS, rows[2][1])[0]) == ("4.9E-324", "5.0E-324")


@pytest.mark.slow
def test_jacksons_string_limit(spark):
    """A string of over 20,000,000 UTF-16 code units is malformed (two 20 MB records)."""
    rows = [(b"ORD", extra(FLIGHT, b'"x":"' + b"A" * 20_000_000 + b'"'), 0, 0), (b"ORD", extra(FLIGHT, b'"x":"' + b"A" * 20_000_001 + b'"'), 0, 1),
            (b"ORD", extra(FLIGHT, b'"x":"' + "\U0001F600".encode() * 10_000_001 + b'"'), 0, 2)]
    frame = spark.createDataFrame(rows, "key BINARY, value BINARY, partition INT, offset LONG")
    got = [r.dead_letter_reason for r in validate_records(frame, FLIGHT_DELAYS, canonical_fast_path=False).orderBy("kafka_offset").collect()]
    assert got == [strict_record(FLIGHT_DELAYS, k, v)[0] for k, v, _, _ in rows] == [None, MALFORMED_JSON, MALFORMED_JSON]
