"""Which regular expressions can take more than linear time, read from the pattern alone.

Python's `re` backtracks: a pattern in which one run of characters can be consumed in more than one
way tries every way before it gives up. Three shapes do that on text a worker or a user controls:

- a nested quantifier: a repeat inside a repeat where one iteration of the outer can end (or start)
  with the inner repeat and the next begin (or the last end) with a character the inner one takes
  (`(\\d[\\d,]*)+$`: n digits split 2^n ways) -- exponential;
- two repeats in a row, with only optional parts between them, that take a common character
  (`\\s*\\**\\s*`: n spaces split n ways, each tried to the end) -- quadratic or worse;
- a pattern that begins with a repeat and can still fail after it, searched in a run of that
  repeat's characters (`\\d+\\.\\d+` in a million digits: each start rescans the rest of the run) --
  quadratic, unless a look-behind keeps it from starting inside the run (`(?<!\\d)\\d+\\.\\d+`).

`problems(pattern)` names each occurrence; the package's own patterns are checked against it by the
tests (`test_untrusted_text.py`), so a new pattern of one of these shapes fails there, not in
production. Possessive repeats and atomic groups (`*+`, `(?>...)`) never backtrack and are not
counted. Character sets are compared on a sample of characters (ASCII, Latin-1 and a few others a
reply holds: `×`, `÷`, fullwidth colon, Arabic-Indic digits, non-breaking and em spaces), so the check
is an approximation made to err on the side of reporting.
"""

from __future__ import annotations

import re
from functools import lru_cache

try:  # Python 3.11+
    from re import _constants as _c
    from re import _parser as _p
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _p  # type: ignore[no-redef]

_SAMPLE = tuple(sorted({chr(i) for i in range(256)} | set("：—\u2003\u2028\u0663中\U0001f600ſK")))
_REPEATS = (_c.MAX_REPEAT, _c.MIN_REPEAT)
_CATEGORIES = {
    _c.CATEGORY_DIGIT: r"\d", _c.CATEGORY_NOT_DIGIT: r"\D", _c.CATEGORY_SPACE: r"\s",
    _c.CATEGORY_NOT_SPACE: r"\S", _c.CATEGORY_WORD: r"\w", _c.CATEGORY_NOT_WORD: r"\W",
    _c.CATEGORY_LINEBREAK: r"\n", _c.CATEGORY_NOT_LINEBREAK: r".",
}
LONG = 16  # a bounded repeat up to this many is short enough to ignore (`\d{1,3}`)


def _category(cat, flags: int) -> frozenset[str]:
    rx = re.compile(_CATEGORIES[cat], flags & re.ASCII)
    return frozenset(ch for ch in _SAMPLE if rx.fullmatch(ch))


def _cased(chars: set[str], flags: int) -> set[str]:
    if not flags & re.IGNORECASE:
        return chars
    return {ch for ch in _SAMPLE if ch.lower() in {c.lower() for c in chars} or ch.upper() in {c.upper() for c in chars}}


def _leaf(op, av, flags: int) -> frozenset[str] | None:
    """The sample characters one single-character node matches; None for any other node."""
    if op is _c.LITERAL:
        return frozenset(_cased({chr(av)}, flags))
    if op is _c.NOT_LITERAL:
        return frozenset(_SAMPLE) - frozenset(_cased({chr(av)}, flags))
    if op is _c.ANY:
        return frozenset(ch for ch in _SAMPLE if ch != "\n" or flags & re.DOTALL)
    if op is not _c.IN:
        return None
    got: set[str] = set()
    negate = False
    for kind, val in av:
        if kind is _c.NEGATE:
            negate = True
        elif kind is _c.LITERAL:
            got |= _cased({chr(val)}, flags)
        elif kind is _c.RANGE:
            got |= _cased({ch for ch in _SAMPLE if val[0] <= ord(ch) <= val[1]}, flags)
        elif kind is _c.CATEGORY:
            got |= _category(val, flags)
    return frozenset(_SAMPLE) - got if negate else frozenset(got)


class _Tree:
    """One parsed pattern and the set algebra over its nodes (first, last and all characters)."""

    def __init__(self, parsed, flags: int):
        self.parsed, self.flags = parsed, flags

    def nullable(self, seq) -> bool:
        return all(self.nullable_node(op, av) for op, av in seq)

    def nullable_node(self, op, av) -> bool:
        if _leaf(op, av, 0) is not None:
            return False
        if op in _REPEATS or op is _c.POSSESSIVE_REPEAT:
            return av[0] == 0 or self.nullable(av[2])
        if op is _c.SUBPATTERN:
            return self.nullable(av[3])
        if op is _c.ATOMIC_GROUP:
            return self.nullable(av)
        if op is _c.BRANCH:
            return any(self.nullable(alt) for alt in av[1])
        if op is _c.GROUPREF_EXISTS:
            return self.nullable(av[1]) or av[2] is None or self.nullable(av[2])
        return True  # AT, ASSERT, ASSERT_NOT, GROUPREF: they consume nothing (a back-reference may)

    def always(self, seq) -> bool:
        """Whether `seq` matches (the empty string at least) wherever it is tried: it cannot fail."""
        for op, av in seq:
            if op in _REPEATS or op is _c.POSSESSIVE_REPEAT:
                if av[0] != 0:
                    return False
            elif op is _c.SUBPATTERN:
                if not self.always(av[3]):
                    return False
            elif op is _c.BRANCH:
                if not any(self.always(alt) for alt in av[1]):
                    return False
            else:
                return False
        return True

    def chars(self, seq, flags: int) -> frozenset[str]:
        out: set[str] = set()
        for op, av in seq:
            out |= self.chars_node(op, av, flags)
        return frozenset(out)

    def chars_node(self, op, av, flags: int) -> frozenset[str]:
        leaf = _leaf(op, av, flags)
        if leaf is not None:
            return leaf
        if op in _REPEATS or op is _c.POSSESSIVE_REPEAT:
            return self.chars(av[2], flags)
        if op is _c.SUBPATTERN:
            return self.chars(av[3], (flags | av[1]) & ~av[2])
        if op is _c.ATOMIC_GROUP:
            return self.chars(av, flags)
        if op is _c.BRANCH:
            return frozenset().union(*(self.chars(alt, flags) for alt in av[1]))
        if op is _c.GROUPREF_EXISTS:
            return self.chars(av[1], flags) | (self.chars(av[2], flags) if av[2] else frozenset())
        if op is _c.GROUPREF:
            return frozenset(_SAMPLE)
        return frozenset()

    def edge(self, seq, flags: int, last: bool) -> frozenset[str]:
        """The characters a match of `seq` can begin with (`last`: end with)."""
        out: set[str] = set()
        for op, av in (reversed(seq) if last else seq):
            out |= self.edge_node(op, av, flags, last)
            if not self.nullable_node(op, av):
                break
        return frozenset(out)

    def edge_node(self, op, av, flags: int, last: bool) -> frozenset[str]:
        leaf = _leaf(op, av, flags)
        if leaf is not None:
            return leaf
        if op in _REPEATS or op is _c.POSSESSIVE_REPEAT:
            return self.edge(av[2], flags, last)
        if op is _c.SUBPATTERN:
            return self.edge(av[3], (flags | av[1]) & ~av[2], last)
        if op is _c.ATOMIC_GROUP:
            return self.edge(av, flags, last)
        if op is _c.BRANCH:
            return frozenset().union(*(self.edge(alt, flags, last) for alt in av[1]))
        if op in (_c.GROUPREF, _c.GROUPREF_EXISTS):
            return frozenset(_SAMPLE)
        return frozenset()

    def ends(self, seq, flags: int, last: bool):
        """(repeat node, its flags) that can be the last (`last`) or first thing a match of `seq` reads."""
        for op, av in (reversed(seq) if last else seq):
            yield from self.ends_node(op, av, flags, last)
            if not self.nullable_node(op, av):
                return

    def ends_node(self, op, av, flags: int, last: bool):
        if op in _REPEATS:
            if av[1] > 1:
                yield (op, av), flags
            yield from self.ends(av[2], flags, last)
        elif op is _c.SUBPATTERN:
            yield from self.ends(av[3], (flags | av[1]) & ~av[2], last)
        elif op is _c.BRANCH:
            for alt in av[1]:
                yield from self.ends(alt, flags, last)


def _long(av) -> bool:
    return av[1] == _c.MAXREPEAT or av[1] > LONG


def _show(node) -> str:
    op, av = node
    hi = "" if av[1] == _c.MAXREPEAT else av[1]
    return f"a repeat {{{av[0]},{hi}}} of {len(av[2])} node(s)"


def _walk(tree: _Tree, seq, flags: int, out: list[str], top: bool) -> None:
    """Every sequence of the pattern, checked for nested and adjacent ambiguous repeats."""
    for i, (op, av) in enumerate(seq):
        if op in _REPEATS and av[1] > 1:
            body = av[2]
            first, lastc = tree.edge(body, flags, False), tree.edge(body, flags, True)
            for inner, f in tree.ends(body, flags, True):
                if tree.edge(inner[1][2], f, True) & first:
                    out.append(f"nested quantifier: {_show(inner)} ends an iteration of {_show((op, av))} "
                               f"and the next iteration can begin with a character it takes")
            for inner, f in tree.ends(body, flags, False):
                if tree.edge(inner[1][2], f, False) & lastc:
                    out.append(f"nested quantifier: {_show(inner)} begins an iteration of {_show((op, av))} "
                               f"and the last iteration can end with a character it takes")
            for bop, bav in body:
                if bop is _c.BRANCH:
                    firsts = [tree.edge(alt, flags, False) for alt in bav[1]]
                    if any(firsts[a] & firsts[b] for a in range(len(firsts)) for b in range(a + 1, len(firsts))):
                        out.append(f"alternatives inside {_show((op, av))} can begin with the same character")
        # two repeats with only optional parts between them, taking a common character
        tails = [(n, f) for n, f in tree.ends([(op, av)], flags, True) if _long(n[1])]
        for j in range(i + 1, len(seq)):
            for head, f in tree.ends([seq[j]], flags, False):
                for tail, g in tails:
                    if _long(head[1]) and tree.edge(tail[1][2], g, True) & tree.edge(head[1][2], f, False):
                        out.append(f"adjacent repeats: {_show(tail)} then {_show(head)} can take the same "
                                   "characters (each split of a run is tried)")
            if not tree.nullable_node(*seq[j]):
                break
        for child, f in _children(op, av, flags):
            _walk(tree, child, f, out, False)


def _children(op, av, flags: int):
    if op in _REPEATS or op is _c.POSSESSIVE_REPEAT:
        yield av[2], flags
    elif op is _c.SUBPATTERN:
        yield av[3], (flags | av[1]) & ~av[2]
    elif op is _c.ATOMIC_GROUP:
        yield av, flags
    elif op is _c.BRANCH:
        for alt in av[1]:
            yield alt, flags
    elif op in (_c.ASSERT, _c.ASSERT_NOT):
        yield av[1], flags
    elif op is _c.GROUPREF_EXISTS:
        yield av[1], flags
        if av[2]:
            yield av[2], flags


def _to_end(run: frozenset[str], rest) -> bool:
    """Whether a repeat of any character is followed by a choice that includes the end of the text
    (`.*?(?:</think>|\\Z)`): it reaches the end, so it never fails."""
    if len(run) < len(_SAMPLE) or not rest:
        return False
    op, av = rest[0]
    alts = av[1] if op is _c.BRANCH else [[rest[0]]]
    return any(len(alt) == 1 and alt[0][0] is _c.AT and alt[0][1] in (_c.AT_END_STRING, _c.AT_END) for alt in alts)


def _guard(tree: _Tree, seq, flags: int) -> tuple[int, frozenset[str] | None]:
    """(where the pattern's leading zero-width guards end, the characters before a start they refuse;
    None: the pattern starts only at the start of the text)."""
    guard: set[str] = set()
    k = 0
    while k < len(seq) and seq[k][0] in (_c.AT, _c.ASSERT_NOT, _c.ASSERT):
        op, av = seq[k]
        if op is _c.AT and (av is _c.AT_BEGINNING_STRING or (av is _c.AT_BEGINNING and not flags & re.MULTILINE)):
            return k, None
        if op is _c.AT and av is _c.AT_BEGINNING:  # multiline ^: a start only after a newline
            guard |= set(_SAMPLE) - {"\n"}
        if op is _c.AT and av is _c.AT_BOUNDARY:  # no boundary between two word characters
            guard |= _category(_c.CATEGORY_WORD, flags)
        if op is _c.ASSERT_NOT and av[0] < 0:
            guard |= tree.chars(av[1], flags)
        if op is _c.ASSERT and av[0] < 0:  # (?<=x): a start only after an x
            guard |= set(_SAMPLE) - tree.chars(av[1], flags)
        k += 1
    return k, frozenset(guard)


def _lead(tree: _Tree, seq, flags: int, guard: frozenset[str], prefix: tuple = ()) -> str | None:
    """A leading repeat, reached after a short prefix that can match its own characters, that a later
    part can make fail: searched inside a long run of its characters, every start rescans the run."""
    for j, (op, av) in enumerate(seq):
        if op is _c.SUBPATTERN:
            return _lead(tree, list(av[3]) + list(seq[j + 1:]), (flags | av[1]) & ~av[2], guard, prefix)
        if op is _c.BRANCH:
            found = [_lead(tree, list(alt) + list(seq[j + 1:]), flags, guard, prefix) for alt in av[1]]
            return next((f for f in found if f), None)
        if op is _c.AT and (av is _c.AT_BEGINNING_STRING or (av is _c.AT_BEGINNING and not flags & re.MULTILINE)):
            return None  # this way, a match starts only at the start of the text
        if op is _c.AT and av is _c.AT_BEGINNING:
            prefix = prefix + (frozenset("\n"),)  # after a newline only
            continue
        if (op in _REPEATS or op is _c.POSSESSIVE_REPEAT) and _long(av):  # possessive: no backtracking, same rescan
            run = tree.chars(av[2], flags)
            rest = list(seq[j + 1:])
            if not all(c & run for c in prefix) or run <= guard or tree.always(rest) or _to_end(run, rest):
                return None
            return (f"leading {_show((op, av))} can fail after it: searched in a long run of its characters, "
                    "each start rescans the run (guard it with a look-behind)")
        if op is _c.ATOMIC_GROUP or op is _c.GROUPREF:
            return None  # not followed further: no pattern of the package starts with one
        if not tree.nullable_node(op, av):  # an optional part is skipped by a start inside the run
            prefix = prefix + (tree.chars_node(op, av, flags),)
    return None


@lru_cache(maxsize=1024)
def problems(pattern: str | bytes, flags: int = 0) -> tuple[str, ...]:
    """The shapes of `pattern` (module docstring) that can take more than linear time; () for none."""
    if isinstance(pattern, bytes):
        pattern = pattern.decode("latin-1")
    parsed = _p.parse(pattern, flags)
    flags = parsed.state.flags
    tree = _Tree(parsed, flags)
    out: list[str] = []
    _walk(tree, list(parsed), flags, out, True)
    k, guard = _guard(tree, list(parsed), flags)
    lead = None if guard is None else _lead(tree, list(parsed)[k:], flags, guard)
    if lead:
        out.append(lead)
    return tuple(dict.fromkeys(out))


def pattern_problems(rx: re.Pattern) -> tuple[str, ...]:
    """`problems` of a compiled pattern."""
    return problems(rx.pattern, rx.flags & ~re.UNICODE)
