"""The documentation stays true to the code: every ``python -m ddp ...``, ``python -m ddp.bench
...``, ``python -m lab ...`` (and ``torchrun ... -m ddp train ...``) command line in README.md and
docs/**/*.md, in code blocks and inline code, is accepted by the argument parser of the program it
names; every relative Markdown link resolves to a file or folder of the repository, and every
``#anchor`` to a heading of the file it points into.

The pages speak to a user of this commit: no word that only the project's history explains
("issue 18", "a session earlier", "predates", "measured earlier") and no path a user's clone
does not have (``../shared/...``, an absolute ``/work/...`` path, a base image only one machine
built). Date a figure by what was measured (the command, the host), not by when.

Commands are parsed, never run: the parsers are those ``ddp/__main__.py``, ``ddp/bench/__main__.py``
and ``lab/cli.py`` build. Placeholders (``<run-id>``, ``...``) are refused in commands: write a
concrete example instead. Failures name the file and line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

# At least this many of each, so that an extraction that silently finds nothing fails.
MIN_COMMANDS = 100
MIN_LINKS = 60

_PROGRAM = re.compile(r"(?:\bpython3?\s+-m|\btorchrun\b[^`]*?\s-m)\s+(ddp\.bench|ddp|lab)(?=\s|$)")
_STOP = {"&&", "||", ";", "|", "&", ")", "("}
_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


# (pattern, why it is refused): words that only the project's history explains
_HISTORY = [
    (r"\bissues?\s+#?\d+", "an issue number"),
    (r"\bPR\s*#?\d+|\bpull request\s+#?\d+", "a pull request number"),
    (r"\bsessions?\b", "a work session"),
    (r"\bpredates?\b", "what a figure predates"),
    (
        r"\b(?:measured|ran|run|gave) earlier\b|\bearlier (?:run|runs) (?:of this page|gave)\b",
        "an earlier run",
    ),
    (
        r"\b(?:the )?(?:earlier|previous|older|newer|old) "
        r"(?:rules|default|host|image|cost model|model|version|wording)\b",
        "an older state of the code or host",
    ),
    (r"\b(?:before|until|since) (?:this|that|the) (?:fix|change|commit|session)\b", "a change"),
    (r"\bno longer\b", "what the code used to do"),
    (r"\bone-bucket-lag\b", "an internal nickname; say what it does"),
]
# paths and names a user's clone does not have
_OUTSIDE = [
    (r"\.\./shared\b", "a folder beside the repository"),
    (r"(?<![\w.])/work/", "an absolute path of one machine"),
    (r"\blab-base:offline\b", "a base image only one machine built"),
    (r"\bmore-hosts\.sh\b", "a script outside the repository"),
]


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    program: str  # ddp, ddp.bench or lab
    argv: tuple[str, ...]
    text: str  # as written, for messages
    inline: bool  # in inline code, where `python -m lab parity` may just name the command


@dataclass(frozen=True)
class Link:
    where: str
    page: Path
    target: str


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _blocks(page: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The page's code-block lines and its prose paragraphs, each with its 1-based line number.
    A paragraph is joined into one string (line breaks kept) so that inline code may wrap."""
    code: list[tuple[int, str]] = []
    prose: list[tuple[int, str]] = []
    para: list[str] = []
    start = 0
    fenced = False
    lines = page.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if _FENCE.match(line):
            fenced = not fenced
            if para:
                prose.append((start, "\n".join(para)))
                para = []
            continue
        if fenced:
            code.append((number, line))
        elif line.strip():
            if not para:
                start = number
            para.append(line)
        elif para:
            prose.append((start, "\n".join(para)))
            para = []
    if para:
        prose.append((start, "\n".join(para)))
    return code, prose


def _joined_code(code: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Code lines with shell continuations (a trailing backslash, or a trailing ``&&``) joined."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in code:
        if pending is not None:
            number, line = pending[0], pending[1] + " " + line.strip()
            pending = None
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending = (number, stripped[:-1])
        elif stripped.endswith("&&"):
            pending = (number, stripped)
        else:
            out.append((number, line))
    if pending is not None:
        out.append(pending)
    return out


def _commands_in(text: str, where: str, inline: bool) -> list[Command]:
    found = []
    for m in _PROGRAM.finditer(text):
        rest = text[m.end() :].replace("\n", " ")
        # `<` and `>` stay inside words, so that a placeholder such as runs/<run-id> is seen
        lexer = shlex.shlex(rest, posix=True, punctuation_chars="();|&")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        argv: list[str] = []
        try:
            for token in lexer:
                if token in _STOP:
                    break
                if argv and token.endswith(":"):  # `python -m ddp.bench --quick: 4 ranks, ...`:
                    argv.append(token[:-1])  # a program echoing its command line, then prose
                    break
                argv.append(token)
        except ValueError as e:  # an unbalanced quote
            argv = [f"<unparsable: {e}>"]
        if argv and argv[0].endswith(":"):  # `python -m lab kill: error: ...`: argparse's
            break  # prefix of a message shown as output, and what it quotes runs on in prose
        written = " ".join([*m.group(0).split(), *argv])
        found.append(Command(where, m.group(1), tuple(argv), written, inline))
    return found


def _collect() -> tuple[list[Command], list[Link]]:
    commands: list[Command] = []
    links: list[Link] = []
    for page in PAGES:
        code, prose = _blocks(page)
        for number, line in _joined_code(code):
            commands += _commands_in(line, f"{_rel(page)}:{number}", inline=False)
        for start, para in prose:
            for m in _INLINE.finditer(para):
                number = start + para.count("\n", 0, m.start())
                commands += _commands_in(m.group(2), f"{_rel(page)}:{number}", inline=True)
            bare = _INLINE.sub("", para)  # links inside inline code are not links
            for m in _LINK.finditer(bare):
                number = start + bare.count("\n", 0, m.start())
                links.append(Link(f"{_rel(page)}:{number}", page, m.group(1)))
    return commands, links


COMMANDS, LINKS = _collect()


def _parse(cmd: Command) -> str | None:
    """None if the program's parser accepts ``cmd`` (``--help`` included), else why not."""
    placeholders = [a for a in cmd.argv if re.search(r"<[^>]*>|^\.\.\.$|^\[", a)]
    if placeholders or "<unparsable" in " ".join(cmd.argv):
        return f"placeholder {placeholders or cmd.argv}: write a concrete example"
    if cmd.inline and cmd.program == "lab" and len(cmd.argv) <= 1:
        # a mention of the program or of one command by name (`python -m lab`, `python -m lab
        # parity`): the command must exist, its required arguments need not be there
        from lab.cli import commands

        if cmd.argv and cmd.argv[0] not in commands():
            return f"no such command {cmd.argv[0]!r}; there are {sorted(commands())}"
        return None
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            _accept(cmd.program, list(cmd.argv))
    except SystemExit as e:
        if e.code not in (0, None):
            return f"exit {e.code}: {err.getvalue().strip().splitlines()[-1:]}"
    except ValueError as e:  # TrainConfig's validation, as `python -m ddp` reports it (exit 2)
        return f"refused by TrainConfig: {e}"
    return None


def _accept(program: str, argv: list[str]) -> None:
    if program == "lab":
        from lab.cli import build_parser

        parser, subparsers = build_parser()
        parser.parse_args(argv)
        _no_abbreviations(subparsers[argv[0]], argv[1:])
    elif program == "ddp.bench":
        from ddp.bench.__main__ import _parser

        _parser().parse_args(argv)
        _no_abbreviations(_parser(), argv)
    else:
        from ddp.__main__ import _parser
        from ddp.torchfree import config_from_args

        one_rank = argv[:1] == ["train"]
        parser, names = _parser(one_rank)
        args = parser.parse_args(argv[1:] if one_rank else argv)
        _no_abbreviations(parser, argv[1:] if one_rank else argv)
        # what `python -m ddp` checks before any process exists, without touching the disk
        cfg = config_from_args(args, names)
        if args.world_size is not None and cfg.recovery == "restart":  # as ddp.__main__
            cfg.local_batch(args.world_size)


def _no_abbreviations(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """argparse accepts any unambiguous prefix of a flag; the docs spell flags out in full.
    Past ``--`` the words are a command's own (``lab run -- python train.py --steps 3``)."""
    known = set(parser._option_string_actions)
    for token in argv:
        if token == "--":
            break
        flag = token.split("=", 1)[0]
        if flag.startswith("--") and flag != "--" and flag not in known:
            parser.error(f"{flag} is not spelled as the parser spells it (an abbreviation?)")


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_command_is_accepted_by_its_parser(cmd: Command) -> None:
    why = _parse(cmd)
    assert why is None, f"{cmd.where}: `{cmd.text}` is not accepted: {why}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    _, prose = _blocks(page)
    seen: dict[str, int] = {}
    anchors = set()
    for _, para in prose:
        for line in para.splitlines():
            m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


@pytest.mark.parametrize("link", LINKS, ids=[link.where for link in LINKS])
def test_link_resolves(link: Link) -> None:
    target = link.target
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
        return
    path_part, _, anchor = target.partition("#")
    dest = (link.page.parent / path_part).resolve() if path_part else link.page
    assert dest.is_relative_to(ROOT), f"{link.where}: {target} points outside the repository"
    assert dest.exists(), f"{link.where}: {target} does not exist ({_rel(dest)})"
    if anchor and dest.suffix == ".md":
        known = _anchors(dest)
        assert anchor in known, (
            f"{link.where}: {target}: no heading #{anchor} in {_rel(dest)} (has: {sorted(known)})"
        )


def _lines() -> list[tuple[str, str]]:
    """Every line of every page (prose and code: shown output counts too), as (file:line, text)."""
    out = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            out.append((f"{_rel(page)}:{number}", line))
    return out


@pytest.mark.parametrize(
    ("rules", "what"), [(_HISTORY, "the project's history"), (_OUTSIDE, "outside the repository")]
)
def test_pages_speak_of_this_repository_only(rules: list[tuple[str, str]], what: str) -> None:
    found = [
        f"{where}: {m.group(0)!r} ({why})"
        for where, line in _lines()
        for pattern, why in rules
        for m in re.finditer(pattern, line, re.IGNORECASE)
    ]
    assert not found, f"{len(found)} reference(s) to {what}:\n" + "\n".join(found)


def test_the_rules_catch_what_they_are_for() -> None:
    """The patterns above refuse the phrasings they were written for, and let plain prose pass."""
    refused = [
        "Targets of issue 18: hierarchical",
        "The same bench a session earlier gave 1.046",
        "That run's image predates the auto cap",
        "Measured earlier on this host",
        "the earlier rules (TCP-based delay)",
        "the one-bucket-lag hook",
        "the coordinator no longer polls the store",
    ]
    outside = ["see ../shared/tools/more-hosts.sh", "--base-image lab-base:offline", "/work/main"]
    passed = [
        "one left over from an earlier rendezvous is refused",
        "rank 2 issues its allreduce",
        "the previous reply's ACK",
        "runs/bench/bench.json",
    ]
    hits = [any(re.search(p, t, re.IGNORECASE) for p, _ in _HISTORY) for t in refused]
    assert all(hits), [t for t, h in zip(refused, hits, strict=True) if not h]
    hits = [any(re.search(p, t, re.IGNORECASE) for p, _ in _OUTSIDE) for t in outside]
    assert all(hits), [t for t, h in zip(outside, hits, strict=True) if not h]
    for t in passed:
        assert not any(re.search(p, t, re.IGNORECASE) for p, _ in _HISTORY + _OUTSIDE), t


def test_enough_was_checked() -> None:
    """An extraction bug that finds nothing must fail, not pass vacuously."""
    programs = {c.program for c in COMMANDS}
    assert programs == {"ddp", "ddp.bench", "lab"}, f"commands found only for {programs}"
    assert len(COMMANDS) >= MIN_COMMANDS, f"only {len(COMMANDS)} commands found in {PAGES}"
    assert len(LINKS) >= MIN_LINKS, f"only {len(LINKS)} links found in {PAGES}"
