"""Strict record validation in pure Python: the same result as Spark's strict path, record by record.

`strict_record(spec, key, value)` gives the reason and the fields that
`keyshift.processing.operators.records.validate_records(frame, spec, canonical_fast_path=False)` gives the
same Kafka row (rules 1-7 of `keyshift.processing.operators.records`, in their order, with `FILTERED` for a
spec's `keep`), so validation can run in a Python worker (`mapInArrow`) instead of the JVM.
`control_marker(spec, value)` gives what that function reads from an end-of-input marker.
`tests/unit/test_strict_records.py` checks both against Spark row by row (the oracle corpus of
`tests/unit/test_records.py`, the edge cases listed here, and a seeded corpus of mutated records).

What Spark does, measured on Spark 4.2.0 (Jackson 2.21, JDK 17), and how it is matched:

- Rules 1-2: `empty value` for no value or zero bytes; `invalid UTF-8` when `bytes.decode`
  fails (Spark's `is_valid_utf8` and Python's strict decoder agree on overlong forms such as
  `C0 80` and `E0 80 80`, UTF-8-encoded surrogates `ED A0 80`, code points over U+10FFFF and
  5-byte forms; noncharacters such as U+FFFE are valid in both); then `empty value` again for a
  text of JSON whitespace only (space, tab, CR, LF: a UTF-8 BOM or U+00A0 is not whitespace).
- Rule 3 (`try_parse_json`, Jackson with strict settings): the `json` module reads the first
  value (`raw_decode`) with NaN/Infinity rejected, a duplicated name at any depth rejected
  (names compared after unescaping, so `"a"` and `"\\u0061"` collide), raw control characters
  in strings rejected (`strict=True`); a lone UTF-16 surrogate escape anywhere (key or value,
  any depth) is malformed, an escaped surrogate pair is one character. Jackson's read limits are
  enforced too: nesting deeper than 1000 (`[`/`{` levels, the root included), a number with
  more than 1000 digits, a name longer than 50,000 and a string longer than 20,000,000 UTF-16
  code units (after unescaping) are malformed. Digits are counted as Jackson does
  (`_number_too_long`): an integer's digits (sign not counted); a float's integer + fraction +
  exponent digits, except that on Jackson's slow path (a float starting with `0`, or a root
  float reaching the end of the text) an absent fraction or exponent counts -1 (`0.` + 1000
  digits passes, `1.` + 1000 digits does not). Spark reads only the first
  value, so as in `records._reason`: a non-object first value is `not a JSON object`, an object
  is followed by text whose right-trimmed end must be `}` (`{} }` and `{} x}` pass, `{"a":1}x`
  does not). Jackson's root-level token rules decide between `malformed JSON` and `not a JSON
  object` for non-objects, and are mirrored: a root number must be followed by the end or by
  space/tab/CR/LF (`012`, `1x`, `1,` are malformed; `1 2` is a number), a root `true`, `false`
  or `null` must not be followed by a character >= `0` other than `]`/`}` that is a Java
  identifier part (`truex`, `true_`, `true0`, `true\\u00e9` malformed; `true$`, `true x`,
  `true]` a literal; a character outside the BMP is read by Jackson as a surrogate, which is
  no identifier part).
- Rule 5: a long field must be a JSON integer in the signed 64-bit range (`-0` is 0; `1.5`,
  `1e1`, `-12.0`, `true`, 2**63 are `wrong type`); a string field must be a JSON string.
- Rule 6: Spark's `trim` removes only U+0020, so `" \\t "` is not empty; the byte limit counts
  UTF-8 bytes. Rule 7: the Kafka key's bytes against the field's UTF-8 bytes (no key: a
  mismatch; a key `FF` never matches a field `"\\ufffd"`).
- `from_json`'s corrupt-record guard of `records._value_reason` never fired on a record this
  module accepts (an extra `_corrupt_record` field or a differently cased name does not set
  it), so it has no counterpart here; the one case where it can fire is Spark's own
  nondeterminism for long floats in long texts (known differences below).
- Texts of over 1000 characters take a checked path (the read limits), which raises the
  interpreter's recursion limit by the value's depth while it parses (the `json` module's C
  parser recurses once per level); markers are read with the limit raised too.
- A `key_lookup` spec's key column is Spark's binary-to-string cast read back as Python text:
  JDK 17 decodes invalid UTF-8 with one U+FFFD per maximal invalid subpart, as Python's
  `errors="replace"`, except for the surrogate range: `ED A0..BF` + a continuation byte is one
  U+FFFD (Python: three), `ED A0..BF` before another byte or the end is one (Python: two); the
  key is decoded the JDK way (`java_utf8_decode`).

Known differences (none reachable by a record that Kafka and the producers in this repository
write; each is covered where testable by `tests/unit/test_strict_records.py`):

- The Java identifier-part test of the root-literal rule uses Python's Unicode database (14.0
  in Python 3.11) where JDK 17 uses Unicode 13.0: a root `true`/`false`/`null` followed
  directly by a BMP character first assigned in Unicode 14 is `malformed JSON` here when it is
  a letter, mark or digit, `not a JSON object` in Spark.
- `control_marker`'s run id for a marker whose `run_id` is a non-integer number (never written
  by `keyshift.topics.end_of_input_marker`): Spark prints the double with JDK 17's `Double.toString`,
  which is not always the shortest representation (2.82879384806159E17 prints as
  2.82879384806159008E17); here the shortest digits are printed in the JDK's layout.
- Spark itself is not deterministic for a float of exactly the boundary length (over 1000 digits
  counted the fast way, at most 1000 the slow way, not starting with `0`) in a text longer than
  32,768 UTF-16 code units: Jackson then reads through a buffer whose size depends on the
  buffers recycled by earlier parses on the thread, and the float is counted the slow way when
  it crosses a buffer boundary (in `try_parse_json` and in `from_json`, whose failure the
  corrupt-record guard turns into `malformed JSON`). Here it is counted the fast way
  (`malformed JSON`), which is Spark's answer unless the float crosses such a boundary.
- Spark has no answer for a parseable record with objects nested some 800 levels deep (the
  exact depth depends on the JIT: 750 passed and 800 failed in a fresh JVM, 999 passed in a
  warm one): `schema_of_variant` overflows the task thread's stack and the StackOverflowError,
  a fatal error for Spark, ends the executor (in local mode the whole driver JVM). Here such a
  record is judged by the rules (nesting up to 1000 levels is valid JSON). Arrays 999 deep
  passed in a fresh JVM.
- A value so large that Spark's variant builder refuses it (its own size limit; a 20 MB record
  still passes) is not detected here.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
import unicodedata
from decimal import Decimal

from keyshift.names import END_OF_INPUT_PREFIX
from keyshift.processing.operators.records import (
    EMPTY_VALUE,
    FILTERED,
    INVALID_UTF8,
    JSON_WHITESPACE,
    MALFORMED_JSON,
    MAX_CODE_BYTES,
    NOT_AN_OBJECT,
    key_mismatch,
)
from keyshift.jobs.spec import JobSpec

MAX_DEPTH = 1000
"""Jackson's `StreamReadConstraints` default: nesting deeper than this is malformed."""
MAX_NUMBER_LENGTH = 1000
"""... a number with more digits than this is malformed ..."""
MAX_NAME_LENGTH = 50_000
"""... a field name longer than this (UTF-16 code units) is malformed ..."""
MAX_STRING_LENGTH = 20_000_000
"""... and so is a string value longer than this (UTF-16 code units)."""

_LONG_TEXT = min(MAX_DEPTH, MAX_NUMBER_LENGTH)
"""A text no longer than this can break none of the read limits (each needs more characters)."""

_WS = JSON_WHITESPACE
_MISSING = object()
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NUMBER = re.compile(r"(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
"""A JSON number after its optional minus sign: integer part, fraction, exponent."""
_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.S)
_JAVA_IDENTIFIER_CATEGORIES = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc", "Nd", "Mn", "Mc", "Cf"})


class _Malformed(ValueError):
    """Raised inside the JSON decoder's hooks: the text is not strict JSON for Spark."""


def _object(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Malformed("duplicated name")
    return obj


def _object_checked(pairs: list) -> dict:
    obj = _object(pairs)
    if obj and max(map(len, obj)) * 2 > MAX_NAME_LENGTH and max(map(_utf16_length, obj)) > MAX_NAME_LENGTH:
        raise _Malformed("name too long")
    return obj


def _reject_constant(name: str) -> None:
    raise _Malformed(f"{name} is not JSON")


def _int_checked(text: str) -> int:
    if len(text) - (text[0] == "-") > MAX_NUMBER_LENGTH:
        raise _Malformed("number too long")
    return int(text)


def _number_too_long(match: re.Match, end_of_text: bool) -> bool:
    """Jackson's number-length check of a number token (`_NUMBER` match), as Spark meets it.

    An integer counts its digits. A float counts integer + fraction + exponent digits on
    Jackson's fast path, but on its slow path (a number starting with `0` after an optional
    `-`, or one that reaches the end of the parser's buffer: for a text of at most 32,768
    characters, the end of the text) an absent fraction and an absent exponent count -1 each:
    `0.` + 1000 digits passes where `1.` + 1000 digits does not.
    """
    whole, fraction, exponent = match.group(1, 2, 3)
    count = len(whole)
    if fraction is None and exponent is None:
        return count > MAX_NUMBER_LENGTH
    absent = -1 if whole == "0" or end_of_text else 0
    count += len(fraction) - 1 if fraction is not None else absent
    count += len(exponent) - 1 - (exponent[1] in "+-") if exponent is not None else absent
    return count > MAX_NUMBER_LENGTH


def _float_checked(text: str) -> float:
    if len(text) > MAX_NUMBER_LENGTH + 1 and _number_too_long(_NUMBER.match(text, text[0] == "-"), False):
        raise _Malformed("number too long")
    return float(text)


_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_reject_constant)
_DECODER_CHECKED = json.JSONDecoder(object_pairs_hook=_object_checked, parse_constant=_reject_constant,
                                    parse_int=_int_checked, parse_float=_float_checked)


def _utf16_length(text: str) -> int:
    """Java's `String.length()` of `text` (astral characters count twice)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _depth(text: str, start: int) -> int:
    """Nesting depth of the first JSON value in `text` from `start` (exact when that value is
    well-formed; a malformed one is rejected by the parser whatever this says)."""
    if text[start] not in "[{":
        return 0
    depth = deepest = 0
    for match in _STRUCTURE.finditer(text, start):
        c = text[match.start()]
        if c == '"':
            continue
        if c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_DEPTH:
                    break
        else:
            depth -= 1
            if depth <= 0:
                break
    return deepest


def _breaks_string_rules(value: object, long_strings: bool) -> bool:
    """True when a string or name in the parsed `value` holds a lone surrogate or (with
    `long_strings`) is over `MAX_STRING_LENGTH` UTF-16 code units. Iterative: any depth."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            if _SURROGATE.search(item) or (long_strings and len(item) * 2 > MAX_STRING_LENGTH
                                           and _utf16_length(item) > MAX_STRING_LENGTH):
                return True
        elif kind is dict:
            for name in item:
                if _SURROGATE.search(name):
                    return True
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
    return False


def _java_identifier_part(c: str) -> bool:
    """Java's `Character.isJavaIdentifierPart` of the UTF-16 unit Jackson sees for `c`."""
    code = ord(c)
    if code > 0xFFFF or 0xD800 <= code <= 0xDFFF:
        return False  # Jackson reads a surrogate: no identifier part
    if code <= 0x08 or 0x0E <= code <= 0x1B or 0x7F <= code <= 0x9F:
        return True  # identifier-ignorable controls
    return unicodedata.category(c) in _JAVA_IDENTIFIER_CATEGORIES


def _parse(text: str, start: int) -> object:
    """The first JSON value of `text` (its first non-whitespace character at `start`) as
    Spark's `try_parse_json` reads it, or raise ValueError (malformed).

    Returns dict/list/str/int/float/bool/None; a non-object root is checked with Jackson's
    root-level rules (module docstring), so its type alone decides `not a JSON object`.
    """
    first = text[start]
    if first == "-" or "0" <= first <= "9":
        return _root_number(text, start)
    if len(text) <= _LONG_TEXT:
        try:
            value, stop = _DECODER.raw_decode(text, start)
        except RecursionError:  # a deep value in a deep call stack: the checked path copes
            value, stop = _parse_checked(text, start)
    else:
        value, stop = _parse_checked(text, start)
    if "\\u" in text and _SURROGATE_ESCAPE.search(text) and _breaks_string_rules(value, False):
        raise _Malformed("lone surrogate")
    if first in "tfn" and stop < len(text):
        c = text[stop]
        if c >= "0" and c not in "]}" and _java_identifier_part(c):
            raise _Malformed("unrecognized token")
    return value


def _root_number(text: str, start: int) -> int:
    """A root-level number: Jackson wants the end of the text or JSON whitespace after it.
    Returns 0 for any number (only its kind matters: not an object); raises when malformed."""
    negative = text[start] == "-"
    match = _NUMBER.match(text, start + negative)
    if match is None:
        raise _Malformed("not a number")
    stop = match.end()
    if stop < len(text) and text[stop] not in _WS:
        raise _Malformed("no space after a root-level number")
    if stop - start > MAX_NUMBER_LENGTH and _number_too_long(match, stop == len(text)):
        raise _Malformed("number too long")
    return 0


def _parse_checked(text: str, start: int) -> tuple[object, int]:
    """`raw_decode` with Jackson's read limits (module docstring); any depth up to the limit."""
    depth = _depth(text, start)
    if depth > MAX_DEPTH:
        raise _Malformed("nesting too deep")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + depth + 200)  # the C parser recurses once per level
    try:
        value, stop = _DECODER_CHECKED.raw_decode(text, start)
    except RecursionError as error:
        raise _Malformed("nesting too deep for this interpreter") from error
    finally:
        sys.setrecursionlimit(limit)
    if len(text) * 2 > MAX_STRING_LENGTH and _breaks_string_rules(value, True):
        raise _Malformed("string too long")
    return value, stop


class _Plan:
    """What `strict_record` needs of a spec, computed once per spec."""

    __slots__ = ("spec", "fields", "checks", "key_name", "mismatch", "keep", "lookup", "event_time")

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.fields = tuple(
            (f.name, f.col, f.dtype == "long", f"missing {f.name}", f"null {f.name}", f"wrong type for {f.name}")
            for f in spec.fields
        )
        checks = []
        for f in spec.fields:  # records._value_reason's order: per string field empty then over ...
            if f.non_empty:
                checks.append((f.name, "empty", f"empty {f.name}", f"{f.name} over {MAX_CODE_BYTES} bytes"))
        for f in spec.fields:  # ... then the non-negative longs
            if f.non_negative:
                checks.append((f.name, "negative", f"negative {f.name}", None))
        self.checks = tuple(checks)
        self.lookup = spec.key_lookup is not None
        self.key_name = None if self.lookup else next(f.name for f in spec.fields if f.col == spec.key)
        self.mismatch = key_mismatch(spec)
        self.keep = (spec.keep.field, frozenset(spec.keep.values)) if spec.keep is not None else None
        self.event_time = next(f.name for f in spec.fields if f.col == spec.event_time)


_PLANS: dict[int, _Plan] = {}


def _plan(spec: JobSpec) -> _Plan:
    plan = _PLANS.get(id(spec))
    if plan is None or plan.spec is not spec:
        plan = _PLANS[id(spec)] = _Plan(spec)
    return plan


def strict_record(spec: JobSpec, key: bytes | None, value: bytes | None) -> tuple[str | None, dict[str, object] | None]:
    """Validate one Kafka record as `validate_records(..., canonical_fast_path=False)` does.

    Args:
        spec: the job whose record this is.
        key: the Kafka key's bytes (None: no key).
        value: the Kafka value's bytes (None: a tombstone).

    Returns:
        `(reason, fields)`. `reason` is the first rule the record breaks, with the strings of
        `keyshift.processing.operators.records` (`EMPTY_VALUE`, `INVALID_UTF8`, `MALFORMED_JSON`,
        `NOT_AN_OBJECT`, `missing F`, `null F`, `wrong type for F`, `empty F`,
        `F over 1024 bytes`, `negative F`, `key_mismatch(spec)`), `FILTERED` for a record that
        passes every rule but is not kept by `spec.keep`, or None for a valid record. `fields`
        is `{field.col: value}` (int for a long field, str for a string field) for a valid or
        `FILTERED` record (Spark's output nulls a filtered record's fields; these are the
        values it parsed), else None. With `spec.key_lookup` there is no key rule here (it is
        checked after the lookup) and `fields[spec.key]` is the Kafka key as text, decoded as
        the JVM does (`java_utf8_decode`; None without a key).

    Never raises for any bytes; an end-of-input marker is judged like any record (Spark ignores
    its reason: see `control_marker`). The module docstring lists what is matched and the
    known differences.
    """
    if not value:
        return EMPTY_VALUE, None
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return INVALID_UTF8, None
    end = len(text)
    while end and text[end - 1] in _WS:
        end -= 1
    if not end:
        return EMPTY_VALUE, None
    start = 0
    while text[start] in _WS:
        start += 1
    try:
        if text[start] == "{" and len(text) <= _LONG_TEXT:  # the common case, inline
            try:
                obj = _DECODER.raw_decode(text, start)[0]
            except RecursionError:
                obj = _parse(text, start)
            else:
                if "\\u" in text and _SURROGATE_ESCAPE.search(text) and _breaks_string_rules(obj, False):
                    return MALFORMED_JSON, None
        else:
            obj = _parse(text, start)
    except ValueError:  # JSONDecodeError and _Malformed
        return MALFORMED_JSON, None
    if type(obj) is not dict:
        return NOT_AN_OBJECT, None
    if text[end - 1] != "}":
        return MALFORMED_JSON, None
    plan = _PLANS.get(id(spec))
    if plan is None or plan.spec is not spec:
        plan = _plan(spec)
    fields = {}
    for name, col, is_long, missing, null, wrong in plan.fields:
        v = obj.get(name, _MISSING)
        if v is _MISSING:
            return missing, None
        if v is None:
            return null, None
        if is_long:
            if type(v) is not int or not _INT64_MIN <= v <= _INT64_MAX:
                return wrong, None
        elif type(v) is not str:
            return wrong, None
        fields[col] = v
    for name, check, reason, over in plan.checks:
        v = obj[name]
        if check == "empty":
            if not v.strip(" "):
                return reason, None
            if len(v) * 4 > MAX_CODE_BYTES and len(v.encode()) > MAX_CODE_BYTES:
                return over, None
        elif v < 0:
            return reason, None
    if plan.lookup:
        fields[spec.key] = None if key is None else java_utf8_decode(key)
    elif key is None or key != obj[plan.key_name].encode():
        return plan.mismatch, None
    if plan.keep is not None and obj[plan.keep[0]] not in plan.keep[1]:
        return FILTERED, fields
    return None, fields


def _java_replace(error: UnicodeDecodeError) -> tuple[str, int]:
    """Codec error handler: JDK 17's `new String(bytes, UTF_8)` replacement (module docstring)."""
    data, at = error.object, error.start
    if data[at] == 0xED and at + 1 < len(data) and 0xA0 <= data[at + 1] <= 0xBF:
        if at + 2 < len(data) and 0x80 <= data[at + 2] <= 0xBF:
            return "\ufffd", at + 3  # a whole encoded surrogate: one replacement
        return "\ufffd", at + 2
    return "\ufffd", error.end


codecs.register_error("keyshift.java_replace", _java_replace)


def java_utf8_decode(data: bytes) -> str:
    """`data` as text the way the JVM reads Spark's binary-to-string cast (JDK 17
    `new String(bytes, UTF_8)`): valid UTF-8 as is, each invalid sequence replaced by U+FFFD
    with the JDK's grouping of bytes (module docstring). Never raises."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", "keyshift.java_replace")


# ---------------------------------------------------------------- end-of-input markers

class _Lenient:
    """Jackson's reader as Spark's `get_json_object` and `from_json` configure it, for markers.

    Both allow single-quoted names and strings (and `\\'`) and read the first value only;
    `control_chars` allows raw control characters in strings (`get_json_object`),
    `non_numeric` allows NaN, Infinity, +Infinity, -Infinity, +INF, -INF (`from_json`). Leading
    zeros, trailing commas, comments and unquoted names are errors in both, as are Jackson's read
    limits. Duplicated names are kept. Nodes: ("obj", [(name, node)...]), ("arr", [node...]),
    ("str", text), ("int", text), ("float", text), ("nonnum", text), ("lit", True/False/None).
    Raises ValueError on anything Jackson rejects.
    """

    _ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "'": "'"}

    def __init__(self, text: str, control_chars: bool, non_numeric: bool) -> None:
        self.text, self.at, self.control_chars, self.non_numeric = text, 0, control_chars, non_numeric

    def fail(self, what: str) -> None:
        raise ValueError(f"{what} at {self.at}")

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def skip_space(self) -> str:
        text = self.text
        while self.at < len(text):
            c = text[self.at]
            if c > " ":
                return c
            if c not in _WS:
                self.fail("control character")
            self.at += 1
        self.fail("end of input")

    def token(self, word: str) -> None:
        if not self.text.startswith(word, self.at):
            self.fail("unrecognized token")
        self.at += len(word)
        c = self.peek()
        if c and c >= "0" and c not in "]}" and _java_identifier_part(c):
            self.fail("unrecognized token")

    def value(self, depth: int) -> tuple:
        c = self.skip_space()
        if c in "{[":
            if depth + 1 > MAX_DEPTH:
                self.fail("nesting too deep")
            self.at += 1
            return self.container(c, depth + 1)
        if c == '"' or c == "'":
            return ("str", self.string(MAX_STRING_LENGTH))
        for word, literal in (("true", True), ("false", False), ("null", None)):
            if c == word[0]:
                self.token(word)
                return ("lit", literal)
        if c == "-" or "0" <= c <= "9":
            return self.number()
        if self.non_numeric:
            for word in ("NaN", "Infinity", "+Infinity", "+INF"):
                if self.text.startswith(word, self.at):
                    self.token(word)
                    return ("nonnum", word)
        self.fail("unexpected character")

    def container(self, opener: str, depth: int) -> tuple:
        closer = "}" if opener == "{" else "]"
        items: list = []
        if self.skip_space() == closer:
            self.at += 1
        else:
            while True:
                if opener == "{":
                    if self.skip_space() not in "\"'":
                        self.fail("name expected")
                    name = self.string(MAX_NAME_LENGTH)
                    if self.skip_space() != ":":
                        self.fail("colon expected")
                    self.at += 1
                    items.append((name, self.value(depth)))
                else:
                    items.append(self.value(depth))
                c = self.skip_space()
                self.at += 1
                if c == closer:
                    break
                if c != ",":
                    self.fail("comma expected")
        return ("obj" if opener == "{" else "arr", items)

    def string(self, limit: int) -> str:
        text, quote = self.text, self.text[self.at]
        self.at += 1
        out = []
        units = False
        while True:
            if self.at >= len(text):
                self.fail("unterminated string")
            c = text[self.at]
            self.at += 1
            if c == quote:
                break
            if c == "\\":
                e = text[self.at:self.at + 1]
                self.at += 1
                if e == "u":
                    digits = text[self.at:self.at + 4]
                    if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                        self.fail("bad unicode escape")
                    self.at += 4
                    out.append(chr(int(digits, 16)))
                    units = True
                elif e in self._ESCAPES:
                    out.append(self._ESCAPES[e])
                else:
                    self.fail("bad escape")
            elif c < " " and not self.control_chars:
                self.fail("control character in string")
            else:
                out.append(c)
        result = "".join(out)
        if units:  # join escaped surrogate pairs as Java strings hold them
            result = result.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
        if len(result) * 2 > limit and _utf16_length(result) > limit:
            self.fail("string too long")
        return result

    def number(self) -> tuple:
        text, begin = self.text, self.at
        if text[self.at] == "-":
            self.at += 1
            if self.non_numeric and (text.startswith("Infinity", self.at) or text.startswith("INF", self.at)):
                self.at = begin
                self.token("-Infinity" if text.startswith("Infinity", begin + 1) else "-INF")
                return ("nonnum", text[begin:self.at])
        digits = self.digits()
        if not digits or (digits > 1 and text[self.at - digits] == "0"):
            self.fail("bad number")
        kind, count = "int", digits
        if self.peek() == ".":
            self.at += 1
            fraction = self.digits()
            if not fraction:
                self.fail("bad fraction")
            kind, count = "float", count + fraction
        if self.peek() in ("e", "E"):
            self.at += 1
            if self.peek() in ("+", "-"):
                self.at += 1
            exponent = self.digits()
            if not exponent:
                self.fail("bad exponent")
            kind, count = "float", count + exponent
        if count > MAX_NUMBER_LENGTH:
            self.fail("number too long")
        return (kind, text[begin:self.at])

    def digits(self) -> int:
        text, begin = self.text, self.at
        while self.at < len(text) and "0" <= text[self.at] <= "9":
            self.at += 1
        return self.at - begin


def _java_double(x: float) -> str:
    """JDK's `Double.toString` layout of `x` (with the shortest digits; module docstring)."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if str(x).startswith("-") else "0.0"
    sign = "-" if x < 0 else ""
    _, digits, exponent = Decimal(repr(abs(x))).normalize().as_tuple()
    digits = "".join(map(str, digits))
    point = len(digits) + exponent  # value = 0.DIGITS * 10**point
    if 1e-3 <= abs(x) < 1e7:
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        whole, fraction = (digits + "0" * point)[:point], digits[point:]
        return f"{sign}{whole}.{fraction or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{point - 1}"


def _json_string(text: str) -> str:
    """Jackson's UTF-8 generator's quoting: short escapes for \\b \\t \\n \\f \\r, \\uXXXX
    (upper case) for other controls and for UTF-16 surrogates (astral characters as a pair)."""
    out = ['"']
    for c in text:
        code = ord(c)
        if c == '"' or c == "\\":
            out.append("\\" + c)
        elif code < 0x20:
            short = {8: "b", 9: "t", 10: "n", 12: "f", 13: "r"}.get(code)
            out.append("\\" + short if short else f"\\u{code:04X}")
        elif code > 0xFFFF:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04X}\\u{0xDC00 + (code & 0x3FF):04X}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04X}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _render(node: tuple) -> str:
    """`JsonGenerator.copyCurrentStructure` of a node, as `get_json_object` prints it."""
    kind, item = node
    if kind == "obj":
        return "{" + ",".join(f"{_json_string(name)}:{_render(value)}" for name, value in item) + "}"
    if kind == "arr":
        return "[" + ",".join(_render(value) for value in item) + "]"
    if kind == "str":
        return _json_string(item)
    if kind == "int":
        return str(int(item))
    if kind == "float":
        number = float(item)
        text = _java_double(number)
        return f'"{text}"' if number in (float("inf"), float("-inf")) else text  # QUOTE_NON_NUMERIC_NUMBERS
    return {True: "true", False: "false", None: "null"}[item]


def _lenient_members(text: str, control_chars: bool, non_numeric: bool) -> list | None:
    """The (name, node) members of the object `text` starts with, read by `_Lenient` with these
    leniencies; None when it does not parse or its first value is not an object."""
    try:
        root = _Lenient(text, control_chars=control_chars, non_numeric=non_numeric).value(0)
    except (ValueError, RecursionError):
        return None
    return root[1] if root[0] == "obj" else None


def _marker_run_id(text: str) -> str | None:
    """Spark's `get_json_object(text, '$.run_id')` for a marker's text."""
    members = _lenient_members(text, control_chars=True, non_numeric=False)
    for name, node in members or ():
        if name == "run_id" and node != ("lit", None):  # a null value does not match; the next may
            if node[0] == "str":  # printed raw: a lone surrogate fails the UTF-8 output
                return None if _SURROGATE.search(node[1]) else node[1]
            return _render(node)
    return None


def _marker_event_time(text: str, name: str) -> int | None:
    """Spark's `from_json` long field `name` of a marker's text: the last value given that
    converts (a JSON integer in range, or null), None when the text does not parse."""
    members = _lenient_members(text, control_chars=False, non_numeric=True)
    if members is None:
        return None
    result = None
    for field, (kind, item) in members:
        if field == name:
            if kind == "lit" and item is None:
                result = None
            elif kind == "int" and _INT64_MIN <= int(item) <= _INT64_MAX:
                result = int(item)
            # any other value fails to convert: Spark keeps the partial row, the field unchanged
    return result


def control_marker(spec: JobSpec, value: bytes | None) -> tuple[str | None, int | None] | None:
    """What `validate_records` reads from an end-of-input marker (`keyshift.names.END_OF_INPUT_PREFIX`).

    Args:
        spec: the job (its event-time field is the one whose column is `spec.event_time`).
        value: the Kafka value's bytes (None: a tombstone).

    Returns:
        None when the value is not a marker (not UTF-8, or its text does not start with the
        prefix: Spark's `is_control` false). Otherwise `(run_id, event_time_ms)`: `run_id` is
        Spark's `get_json_object(text, '$.run_id')` (a string's text, other values as compact
        JSON, None when missing, null or when the text does not parse for that reader) and
        `event_time_ms` is `from_json`'s long field (None when missing, not an in-range
        integer, or the text does not parse for that reader). Both readers are lenient where
        Spark's are (single quotes; raw control characters for the run id; NaN/Infinity for the
        event time) and read only the first JSON value; see `_Lenient`. Never raises.
    """
    if value is None or not value.startswith(END_OF_INPUT_PREFIX.encode()):
        return None
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return None
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 3 * MAX_DEPTH + 200)  # the lenient reader recurses per level
    try:
        return _marker_run_id(text), _marker_event_time(text, _plan(spec).event_time)
    finally:
        sys.setrecursionlimit(limit)
