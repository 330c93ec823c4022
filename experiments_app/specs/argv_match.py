"""Matching one recorded command line (an argv list) against a pattern: coder-eval's semantics,
shared by the `cli_called` criterion (which reads the log afterwards) and a `record_cli` shim's
response rules (which pick an answer inside the sandbox while the agent runs).

Standard library only, and importing nothing else of the project: the file is copied beside
every shim whose tool has response rules and loaded there by path, where nothing of evalsite is
installed. A pattern is a plain dict (`MatchSpec`), as the spec models lower it:

    {"verb_spellings": [["projects", "list"]],   # each accepted verb as tokens; [] = any
     "positional": ["proj-1"] | None,            # non-flag arguments right after the verb
     "flags": {"output": {"equals": "json", ...}} | None,
     "value_flags": ["output"],                  # flags that take the next token as their value
     "ignore_flags": ["output"]}                 # flags dropped before matching

Rules (coder-eval 0.12.16's `argv_match`):
1. Only a flag named in `value_flags` (or holding a value predicate) takes the next token; any
   other flag is a switch, so `--yes proj-1` keeps `proj-1` positional.
2. `--name=value` binds directly; `--` ends the flags; a lone `-` and a negative number are
   positional; an undeclared `-rf` is the switches `r` and `f`.
3. A verb is an ordered prefix of the non-flag arguments, compared token by token.
4. Every flag predicate must hold; a value predicate holds when any of the flag's values does.
"""

import re


def split_flags(argv, ignore, value_flags, known_names=frozenset()):
    """(non-flag arguments, {flag name: [values]}) of `argv` (rules 1 and 2)."""
    positional: list = []
    flags: dict = {}

    def record(name, value):
        if name not in ignore:
            flags.setdefault(name, []).append(value)

    index, end_of_flags = 0, False
    while index < len(argv):
        token = argv[index]
        index += 1
        if end_of_flags or not token.startswith("-") or token == "-":
            positional.append(token)
            continue
        if token == "--":
            end_of_flags = True
            continue
        if "=" in token:
            name, _, value = token.partition("=")
            record(name.lstrip("-"), value)
            continue
        name = token.lstrip("-")
        known = name in value_flags or name in known_names
        if not known and is_number(name):  # `-1` is a value
            positional.append(token)
            continue
        if not known and not token.startswith("--") and len(name) > 1:
            # Clustered short switches; a declared value flag first takes the rest as its value.
            if name[0] in value_flags:
                record(name[0], name[1:])
            else:
                for char in name:
                    record(char, "")
            continue
        if name in value_flags and index < len(argv):
            record(name, argv[index])
            index += 1
        else:
            record(name, "")
    return positional, flags


def is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def needs_value(predicate):
    """Whether a flag predicate reads the flag's value (`present` and `absent` do not, so they
    never make a switch swallow the next token)."""
    return not (predicate["present"] or predicate["absent"])


def flag_holds(predicate, values):
    """Whether a flag's recorded values (None: not passed) satisfy one predicate."""
    if predicate["absent"]:
        return values is None
    if predicate["present"]:
        return values is not None
    if values is None:
        return False
    if predicate["equals"] is not None:
        return predicate["equals"] in values
    if predicate["contains"] is not None:
        return any(predicate["contains"] in value for value in values)
    if predicate["any_of"] is not None:
        return any(value in predicate["any_of"] for value in values)
    if predicate["matches_regex"] is not None:
        pattern = re.compile(predicate["matches_regex"], predicate["flags"])
        return any(pattern.search(value) is not None for value in values)
    raise AssertionError(f"a flag predicate without a test: {predicate!r}")


def argv_matches(spec, argv):
    """Whether `argv` satisfies every facet of `spec` (rules 3 and 4)."""
    predicates = spec["flags"] or {}
    names = {flag: (flag, *predicate["aliases"]) for flag, predicate in predicates.items()}
    ignore = frozenset(spec["ignore_flags"])
    value_flags = frozenset(spec["value_flags"]) | {
        name for flag, predicate in predicates.items() if needs_value(predicate) for name in names[flag]
    }
    known = frozenset(name for spelled in names.values() for name in spelled) | ignore
    positional, flags = split_flags(argv, ignore, value_flags, known)
    offset = 0
    if spec["verb_spellings"]:
        verb = next((t for t in spec["verb_spellings"] if positional[: len(t)] == list(t)), None)
        if verb is None:
            return False
        offset = len(verb)
    expected = spec["positional"]
    if expected is not None and positional[offset : offset + len(expected)] != list(expected):
        return False
    for flag, predicate in predicates.items():
        values = [value for name in names[flag] for value in flags.get(name, [])]
        if not flag_holds(predicate, values or None):
            return False
    return True


def select_rule(rules, argv):
    """(index, rule) of the first response rule whose `when` matches `argv`, or None."""
    for index, rule in enumerate(rules):
        if argv_matches(rule["when"], argv):
            return index, rule
    return None
