"""Task and experiment YAML -> validated specs plus bundle files, with precise errors (no Django).

Every problem is a `SpecIssue` naming the file, the line, the field path and what was
expected. Loading never stops at the first problem: callers get every error of every
file and must import nothing unless `result.ok`.

Paths inside a YAML are relative to its folder. They may climb (`../templates/x`) but must
stay inside the root: the folder being imported (for a single file: its folder, unless
`root` is given). Symlinks are followed while their targets stay inside the root.

A folder holding `task.toml` is a Harbor task folder (`specs.harbor`): it is read as one task,
its bundle the whole folder, and nothing inside it is read as a task YAML.

A bundle holds the YAML and every file it references; its paths are relative to the
common ancestor folder of all of them, so the same task imported from elsewhere (or
exported and re-imported) gives the same bundle digest.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import ValidationError

from experiments_app.specs import (
    ROW_ID_RE,
    ROW_VAR_RE,
    TASK_DIR_TOKEN,
    ExperimentSpec,
    TaskSpec,
    TemplateDirSource,
    Verifier,
    harbor,
)
from experiments_app.specs.bundles import (
    DEFAULT_MAX_BYTES,
    Bundle,
    BundleTooLarge,
    make_bundle,
    too_large_message,
)
from experiments_app.specs.claude_options import plugin_path
from experiments_app.specs.docker import build_context
from experiments_app.specs.yaml_errors import (
    Doc,
    Loc,
    Root,
    SpecIssue,
    field_name,
    inside,
    locate,
    parse_yaml,
    unknown_key_warnings,
    validation_issues,
)

# YAML parsing and error location live in yaml_errors; Loc and SpecIssue stay importable here.
__all__ = [
    "IGNORED_NAMES",
    "IGNORED_SUFFIXES",
    "WINDOWS_DRIVE",
    "YAML_SUFFIXES",
    "ExperimentLoadResult",
    "Loc",
    "LoadedExperiment",
    "LoadedTask",
    "SpecIssue",
    "TaskLoadResult",
    "load_experiment",
    "load_tasks",
]

YAML_SUFFIXES = (".yaml", ".yml")
# Never part of a bundle: caches and VCS data that change without the task changing.
IGNORED_NAMES = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        ".venv",
        ".DS_Store",
    }
)
IGNORED_SUFFIXES = (".pyc", ".pyo")

WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


@dataclass
class LoadedTask:
    spec: TaskSpec
    task_id: str
    prompt: str  # initial_prompt, or the content of initial_prompt_file ("" for agentless tasks)
    source_yaml: str
    source_path: Path
    yaml_path_in_bundle: str
    files: dict[str, bytes]  # bundle path -> content: the YAML and every referenced file
    bundle: Bundle
    dataset_rows: list[dict[str, Any]] | None = None
    warnings: list[SpecIssue] = field(default_factory=list)


@dataclass
class TaskLoadResult:
    tasks: list[LoadedTask] = field(default_factory=list)
    errors: list[SpecIssue] = field(default_factory=list)
    warnings: list[SpecIssue] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)  # experiment files met while walking folders

    @property
    def ok(self) -> bool:
        """True when nothing is wrong; import nothing otherwise."""
        return not self.errors


@dataclass
class LoadedExperiment:
    spec: ExperimentSpec
    experiment_id: str
    source_yaml: str
    source_path: Path
    yaml_path_in_bundle: str
    files: dict[str, bytes]  # the YAML and the overlay folders / prompt files its variants use
    bundle: Bundle
    variant_prompts: dict[str, str] = field(default_factory=dict)  # variant_id -> replacement prompt
    warnings: list[SpecIssue] = field(default_factory=list)


@dataclass
class ExperimentLoadResult:
    experiment: LoadedExperiment | None = None
    errors: list[SpecIssue] = field(default_factory=list)
    warnings: list[SpecIssue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and self.experiment is not None


# --- files -------------------------------------------------------------------------------------


def _ignored(name: str) -> bool:
    return name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES)


def _walk(folder: Path) -> tuple[list[Path], list[str]]:
    """The task YAML files under `folder`, and its Harbor task folders (not entered)."""
    found, harbors = [], []
    for dirpath, dirnames, filenames in os.walk(folder):
        if harbor.TASK_FILE in filenames:
            harbors.append(os.path.abspath(dirpath))
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if not _ignored(d))
        found += [Path(dirpath, f) for f in sorted(filenames) if f.endswith(YAML_SUFFIXES)]
    return found, harbors


class _Files:
    """Reads referenced files once per load (templates are often shared by many tasks)."""

    def __init__(self) -> None:
        self._cache: dict[str, bytes] = {}

    def read(self, abs_path: str) -> bytes:
        if abs_path not in self._cache:
            with open(abs_path, "rb") as fh:
                self._cache[abs_path] = fh.read()
        return self._cache[abs_path]


# --- referenced paths ------------------------------------------------------------------------

# `$TASK_DIR/check.sh` or `${TASK_DIR}/data/` in a criterion's command (a path without shell
# variables or globs, which only the shell could resolve).
TASK_DIR_PATH = re.compile(r"\$\{?TASK_DIR\}?/([A-Za-z0-9_.+,@=-][A-Za-z0-9_./+,@=-]*)")


class _Source(Protocol):
    """A task file being loaded: a YAML `Doc`, or a Harbor folder's `TomlDoc`."""

    shown: str
    root: Root

    def issue(self, loc: Loc, message: str, severity: str = "error") -> SpecIssue: ...


@dataclass(frozen=True)
class _Ref:
    loc: Loc
    raw: str
    # "dockerfile": a file whose whole folder (its build context) goes in the bundle too.
    kind: Literal["file", "dir", "any", "dockerfile"]
    # A template folder's include_patterns: names the bundle would skip that it keeps.
    include: tuple[str, ...] = ()

    @property
    def kind_name(self) -> str:
        return "folder" if self.kind == "dir" else "file"


def layer_refs(layer: Any, prefix: Loc = ()) -> list[_Ref]:
    """Paths a task or a layer (defaults, variant) points to; same field names on both."""
    refs = []
    if getattr(layer, "initial_prompt_file", None) is not None:
        refs.append(_Ref((*prefix, "initial_prompt_file"), layer.initial_prompt_file, "file"))
    agent = getattr(layer, "agent", None)
    if agent is not None and agent.system_prompt_file is not None:
        refs.append(_Ref((*prefix, "agent", "system_prompt_file"), agent.system_prompt_file, "file"))
    # evalsite: a `command` agent's script travels in the bundle; the runner puts its path
    # where the command says `{script}`.
    script = (agent.model_extra or {}).get("script") if agent is not None else None
    if isinstance(script, str):
        refs.append(_Ref((*prefix, "agent", "script"), script, "file"))
    # A Claude Code plugin's folder travels in the bundle too; the runner mounts it for the agent.
    plugins = (agent.model_extra or {}).get("plugins") if agent is not None else None
    for i, plugin in enumerate(plugins if isinstance(plugins, list) else []):
        if isinstance(plugin, dict) and isinstance(plugin.get("path"), str):
            refs.append(_Ref((*prefix, "agent", "plugins", i, "path"), plugin_path(plugin["path"]), "dir"))
    sandbox = getattr(layer, "sandbox", None)
    for where, sources in (
        (("sandbox", "template_sources"), sandbox.template_sources if sandbox else None),
        (("template_sources",), getattr(layer, "template_sources", None)),
    ):
        for i, source in enumerate(sources or []):
            if isinstance(source, TemplateDirSource):
                include = tuple(source.include_patterns or ())
                refs.append(_Ref((*prefix, *where, i, "path"), source.path, "dir", include))
    if getattr(layer, "reference", None) is not None:
        refs.append(_Ref((*prefix, "reference", "directory"), layer.reference.directory, "dir"))
    docker = sandbox.docker if sandbox is not None else None
    if docker is not None and docker.dockerfile_path is not None:
        refs.append(
            _Ref((*prefix, "sandbox", "docker", "dockerfile_path"), docker.dockerfile_path, "dockerfile")
        )
    suite = getattr(getattr(layer, "hooks", None), "suite", None)
    for i, path in enumerate(suite.files if suite is not None else []):
        refs.append(_Ref((*prefix, "hooks", "suite", "files", i), path, "any"))
    for i, crit in enumerate(getattr(layer, "success_criteria", None) or []):
        if isinstance(crit, Verifier):
            refs.append(_Ref((*prefix, "success_criteria", i, "tests_dir"), crit.tests_dir, "dir"))
        # A criterion's command may run a file of the task's folder: `sh "$TASK_DIR/check.sh"`.
        command = getattr(crit, "command", None)
        for path in TASK_DIR_PATH.findall(command) if isinstance(command, str) else []:
            refs.append(_Ref((*prefix, "success_criteria", i, "command"), path.rstrip("/"), "any"))
        for j, name in enumerate(getattr(crit, "files", [])):
            if name.startswith(TASK_DIR_TOKEN):
                refs.append(
                    _Ref((*prefix, "success_criteria", i, "files", j), name[len(TASK_DIR_TOKEN) :], "file")
                )
    return refs


def _check_ref(doc: Doc, ref: _Ref) -> tuple[str | None, SpecIssue | None]:
    """The absolute (lexical) path of a reference, or the issue that forbids it."""
    raw, root = ref.raw, doc.root
    if not raw.strip():
        return None, doc.issue(ref.loc, "expected a path, got an empty string")
    if os.path.isabs(raw) or raw.startswith(("~", "\\")) or WINDOWS_DRIVE.match(raw):
        return None, doc.issue(ref.loc, f"absolute path {raw!r}: use a path relative to the YAML's folder")
    target = os.path.normpath(os.path.join(os.path.dirname(doc.abs), raw))
    if not inside(root.abs, target):
        return None, doc.issue(ref.loc, f"{raw!r} leaves the folder being imported ({root.display})")
    if not os.path.lexists(target):
        return None, doc.issue(
            ref.loc, f"{ref.kind_name} {raw!r} not found (looked for {root.shown(target)})"
        )
    if not inside(root.real, os.path.realpath(target)):
        return None, doc.issue(ref.loc, f"{raw!r} is a symlink whose target leaves the folder being imported")
    if ref.kind == "any":
        return target, None
    if ref.kind == "dir" and not os.path.isdir(target):
        return None, doc.issue(ref.loc, f"expected a folder, but {raw!r} is a file")
    if ref.kind in ("file", "dockerfile") and not os.path.isfile(target):
        return None, doc.issue(ref.loc, f"expected a file, but {raw!r} is not a regular file")
    return target, None


def _dir_files(doc: _Source, ref: _Ref, top: str, links: bool = True) -> tuple[list[str], list[SpecIssue]]:
    """Every file under a referenced folder, following symlinks that stay inside the root (or,
    without `links`, refusing every symlink: in a build context, where docker would copy the link
    and the bundle its target)."""
    files, issues, seen = [], [], set()
    stack = [top]
    while stack:
        folder = stack.pop()
        real = os.path.realpath(folder)
        if real in seen:  # a symlink loop
            continue
        seen.add(real)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            issues.append(doc.issue(ref.loc, f"cannot read folder {doc.root.shown(folder)}: {exc.strerror}"))
            continue
        for entry in entries:
            relative = Path(os.path.relpath(entry.path, top)).as_posix()
            if _ignored(entry.name) and not any(
                fnmatch.fnmatchcase(relative, p.removeprefix("./")) for p in ref.include
            ):
                continue
            if entry.is_symlink() and not links:
                shown = doc.root.shown(entry.path)
                issues.append(
                    doc.issue(
                        ref.loc,
                        f"{shown} is a symlink in the build context: docker would copy the link, the bundle "
                        "its target: put the file itself there",
                    )
                )
                continue
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if not inside(doc.root.real, target) or not os.path.exists(target):
                    shown = doc.root.shown(entry.path)
                    issues.append(doc.issue(ref.loc, f"{shown} is a symlink leaving the imported folder"))
                    continue
            if entry.is_dir():
                stack.append(entry.path)
            elif entry.is_file():
                files.append(entry.path)
    if not files and not issues:
        issues.append(doc.issue(ref.loc, f"folder {ref.raw!r} is empty; it needs at least one file"))
    return files, issues


@dataclass
class _Collected:
    files: dict[str, bytes]
    yaml_key: str
    by_ref: dict[Loc, str]  # ref location -> absolute path


def _collect(
    doc: Doc, refs: list[_Ref], reader: _Files, max_bytes: int
) -> tuple[_Collected | None, list[SpecIssue]]:
    issues: list[SpecIssue] = []
    by_ref: dict[Loc, str] = {}
    members: list[str] = [doc.abs]
    for ref in refs:
        target, issue = _check_ref(doc, ref)
        if issue is not None or target is None:
            issues += [issue] if issue is not None else []
            continue
        by_ref[ref.loc] = target
        if ref.kind == "dir" or (ref.kind == "any" and os.path.isdir(target)):
            found, problems = _dir_files(doc, ref, target)
            members += found
            issues += problems
        elif ref.kind == "dockerfile":
            found, problems = _dir_files(doc, ref, os.path.dirname(target), links=False)
            members += found
            issues += problems
        else:
            members.append(target)
    issues += _context_issues(doc, refs, by_ref)
    if issues:
        return None, issues
    base = os.path.commonpath([os.path.dirname(doc.abs), *by_ref.values()])
    keys = {Path(os.path.relpath(m, base)).as_posix(): m for m in members}
    yaml_key = Path(os.path.relpath(doc.abs, base)).as_posix()
    # Check the cap before reading, so a stray huge file is never loaded into memory.
    sizes = {key: os.path.getsize(m) for key, m in keys.items()}
    if sum(sizes.values()) > max_bytes:
        return None, [SpecIssue(doc.shown, None, "", too_large_message(sizes, max_bytes))]
    try:
        files = {key: doc.raw if m == doc.abs else reader.read(m) for key, m in sorted(keys.items())}
    except OSError as exc:
        return None, [SpecIssue(doc.shown, None, "", f"cannot read {exc.filename}: {exc.strerror}")]
    return _Collected(files, yaml_key, by_ref), []


def _context_issues(doc: Doc, refs: list[_Ref], by_ref: dict[Loc, str]) -> list[SpecIssue]:
    """A build context must not hold what the agent may not see: a COPY in the Dockerfile would
    put the YAML (a task's checks), the reference solution or a verifier's tests in the image."""
    hidden = [(doc.abs, "this YAML file")]
    for ref in refs:
        if ref.loc in by_ref and ref.loc[-1:] == ("directory",):
            hidden.append((by_ref[ref.loc], "the reference solution"))
        if ref.loc in by_ref and ref.loc[-1:] == ("tests_dir",):
            hidden.append((by_ref[ref.loc], "the verifier's tests"))
    issues = []
    for ref in refs:
        if ref.kind != "dockerfile" or ref.loc not in by_ref:
            continue
        context = os.path.dirname(by_ref[ref.loc])
        for path, what in hidden:
            if inside(context, path) or inside(path, context):
                issues.append(
                    doc.issue(
                        ref.loc,
                        f"the build context (the Dockerfile's folder, {doc.root.shown(context)}) holds "
                        f"{what}: a COPY would put it in the agent's image: move the Dockerfile and what it "
                        "copies into a folder of their own (e.g. environment/)",
                    )
                )
    return issues


def _bundle(doc: _Source, files: dict[str, bytes], max_bytes: int) -> tuple[Bundle | None, SpecIssue | None]:
    try:
        return make_bundle(files, max_bytes), None
    except BundleTooLarge as exc:
        return None, SpecIssue(doc.shown, None, "", str(exc))


def _text(doc: Doc, loc: Loc, path: str, reader: _Files) -> tuple[str, SpecIssue | None]:
    try:
        return reader.read(path).decode("utf-8").strip(), None
    except UnicodeDecodeError:
        return "", doc.issue(loc, "the file is not UTF-8 text")


# --- datasets ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RowAt:
    file: str
    line: int | None
    field: str


def _dataset(doc: Doc, spec: TaskSpec, got: _Collected, reader: _Files) -> tuple[list[dict], list[SpecIssue]]:
    dataset = spec.dataset
    assert dataset is not None
    rows: list[tuple[dict, _RowAt]] = []
    issues: list[SpecIssue] = []
    if dataset.rows is not None:
        for i, row in enumerate(dataset.rows):
            line, path, _ = locate(doc.node, ("dataset", "rows", i))
            rows.append((row, _RowAt(doc.shown, line, field_name(path))))
    for k in range(len(dataset.paths or [])):
        jsonl = got.by_ref[("dataset", "paths", k)]
        more, problems = _jsonl_rows(doc.root.shown(jsonl), reader.read(jsonl), f"dataset.paths[{k}]")
        rows += more
        issues += problems
    issues += _row_issues(rows, dataset.id_field, _row_vars(spec))
    return [row for row, _ in rows], issues


def _jsonl_rows(
    shown: str, content: bytes, field_name: str
) -> tuple[list[tuple[dict, _RowAt]], list[SpecIssue]]:
    rows, issues = [], []
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return [], [SpecIssue(shown, None, field_name, "the file is not UTF-8 text")]
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            issues.append(SpecIssue(shown, n, field_name, f"invalid JSON (column {exc.colno}): {exc.msg}"))
            continue
        except RecursionError:
            issues.append(SpecIssue(shown, n, field_name, "the JSON is nested too deeply to be a row"))
            continue
        if not isinstance(row, dict):
            issues.append(
                SpecIssue(shown, n, field_name, f"expected a JSON object, got {type(row).__name__}")
            )
            continue
        rows.append((row, _RowAt(shown, n, field_name)))
    return rows, issues


def _row_vars(spec: TaskSpec) -> set[str]:
    """Row fields that `${row.x}` placeholders in the prompt and the criteria use."""
    used = set(ROW_VAR_RE.findall(spec.initial_prompt or ""))
    for crit in spec.success_criteria:
        used |= set(ROW_VAR_RE.findall(json.dumps(crit.model_dump(mode="json"))))
    return used


def _row_issues(rows: list[tuple[dict, _RowAt]], id_field: str, used: set[str]) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    first: dict[str, _RowAt] = {}
    for row, at in rows:
        if id_field not in row:
            issues.append(
                SpecIssue(at.file, at.line, at.field, f"row has no {id_field!r} (the dataset's id_field)")
            )
            continue
        row_id = str(row[id_field])
        if not ROW_ID_RE.match(row_id):
            msg = f"row id {row_id!r} must be letters, digits, '_', '-' or '.'"
            issues.append(SpecIssue(at.file, at.line, at.field, msg))
        elif row_id in first:
            other = first[row_id]
            msg = f"duplicate row id {row_id!r} (first at {other.file}:{other.line})"
            issues.append(SpecIssue(at.file, at.line, at.field, msg))
        first.setdefault(row_id, at)
        missing = sorted(used - set(row))
        if missing:
            msg = f"row {row_id!r} has no field {missing[0]!r}, used as ${{row.{missing[0]}}}"
            issues.append(SpecIssue(at.file, at.line, at.field, msg))
    return issues


# --- tasks -------------------------------------------------------------------------------------


def load_tasks(
    paths: list[Path],
    root: Path | None = None,
    max_bundle_bytes: int = DEFAULT_MAX_BYTES,
    *,
    lenient: bool = False,
) -> TaskLoadResult:
    """Load every task in `paths`: task YAML files and Harbor task folders (a folder holding
    `task.toml`, or that file), given or found in folders searched recursively.

    An unknown key is an error (with "did you mean"), as in coder-eval; `lenient` makes it a
    warning instead. A coder-eval or Harbor feature evalsite does not run is an error either way.

    Experiment files (a mapping with `experiment_id`) are skipped, and so are YAML files
    inside folders some YAML uses as a template or reference folder (they are bundle content),
    and everything inside a Harbor task folder.
    """
    result = TaskLoadResult()
    docs: dict[str, Doc] = {}  # by absolute path: overlapping arguments load a file once
    unparsed: dict[str, SpecIssue] = {}
    harbors: dict[str, Root] = {}  # Harbor task folders, by absolute path
    for path in map(Path, paths):
        this_root = Root.of(root if root is not None else (path if path.is_dir() else path.parent))
        if not path.exists():
            result.errors.append(SpecIssue(str(path), None, "", "no such file or folder"))
            continue
        if not inside(this_root.abs, os.path.abspath(path)):
            result.errors.append(SpecIssue(str(path), None, "", f"is outside the root folder {root}"))
            continue
        if path.name == harbor.TASK_FILE and path.is_file():
            harbors.setdefault(os.path.abspath(path.parent), this_root)
            continue
        files, folders = _walk(path) if path.is_dir() else ([path], [])
        for folder in folders:
            harbors.setdefault(folder, this_root)
        for file in files:
            abs_path = os.path.abspath(file)
            if abs_path in docs or abs_path in unparsed:
                continue
            doc, issue = parse_yaml(file, this_root)
            if doc is None:
                unparsed[abs_path] = issue  # type: ignore[assignment]
            else:
                docs[abs_path] = doc
    content = _content_dirs(list(docs.values()))
    # A YAML file inside a template folder may be anything, even invalid YAML.
    result.errors += [
        issue for abs_path, issue in unparsed.items() if not any(inside(f, abs_path) for f, _ in content)
    ]
    reader = _Files()
    loaded: list[tuple[LoadedTask, Doc | harbor.TomlDoc]] = []
    for doc in docs.values():
        if any(inside(folder, doc.abs) for folder, owner in content if owner is not doc):
            continue
        if isinstance(doc.data, dict) and "experiment_id" in doc.data:
            result.skipped.append(Path(doc.shown))
            continue
        task, errors, warnings = _load_task(doc, reader, max_bundle_bytes, lenient)
        result.errors += errors
        result.warnings += warnings
        if task:
            loaded.append((task, doc))
    for folder, folder_root in harbors.items():
        if any(inside(content_dir, folder) for content_dir, _ in content):
            continue
        task, source, errors, warnings = _load_harbor(folder, folder_root, reader, max_bundle_bytes, lenient)
        result.errors += errors
        result.warnings += warnings
        if task and source:
            loaded.append((task, source))
    result.tasks = [task for task, _ in loaded]
    result.errors += _duplicate_ids(loaded)
    return result


def _content_dirs(docs: list[Doc]) -> list[tuple[str, Doc]]:
    """Folders each parsed YAML uses as template or reference folder (found in the raw data)."""
    found = []
    for doc in docs:
        for raw in _raw_dirs(doc.data):
            folder = os.path.normpath(os.path.join(os.path.dirname(doc.abs), raw))
            if os.path.isdir(folder):
                found.append((folder, doc))
    return found


def _raw_dirs(data: Any) -> Iterator[str]:
    if isinstance(data, dict):
        if data.get("type") == "template_dir" and isinstance(data.get("path"), str):
            yield data["path"]
        if data.get("type") == "verifier":
            tests_dir = data.get("tests_dir", "tests")
            yield from [tests_dir] if isinstance(tests_dir, str) else []
        docker = data.get("docker")
        dockerfile = docker.get("dockerfile_path") if isinstance(docker, dict) else None
        if isinstance(dockerfile, str) and dockerfile.strip() and build_context(dockerfile) != ".":
            # (a context that is the task's own folder is refused when the task loads)
            yield build_context(dockerfile)
        reference = data.get("reference")
        if isinstance(reference, str):
            yield reference
        elif isinstance(reference, dict) and isinstance(reference.get("directory"), str):
            yield reference["directory"]
        for value in data.values():
            yield from _raw_dirs(value)
    elif isinstance(data, list):
        for item in data:
            yield from _raw_dirs(item)


def _not_a_mapping(doc: Doc, what: str) -> SpecIssue:
    if doc.data is None:
        return SpecIssue(doc.shown, 1, "", f"the file is empty; expected {what}")
    return doc.issue((), f"expected {what}, got a {type(doc.data).__name__}")


def _load_task(
    doc: Doc, reader: _Files, max_bytes: int, lenient: bool = False
) -> tuple[LoadedTask | None, list[SpecIssue], list]:
    if not isinstance(doc.data, dict):
        return None, [_not_a_mapping(doc, "a mapping of task fields (task_id, initial_prompt, ...)")], []
    try:
        spec = TaskSpec.model_validate(doc.data)
    except ValidationError as exc:
        return None, validation_issues(doc, exc), []
    warnings = unknown_key_warnings(doc, spec, lenient)
    if not lenient and warnings:
        return None, warnings, []
    refs = layer_refs(spec)
    if spec.dataset is not None:
        refs += [_Ref(("dataset", "paths", k), p, "file") for k, p in enumerate(spec.dataset.paths or [])]
    got, errors = _collect(doc, refs, reader, max_bytes)
    if got is None:
        return None, errors, warnings
    errors += _script_issues(doc, spec, got)
    prompt = spec.initial_prompt or ""
    if spec.initial_prompt_file is not None:
        prompt, issue = _text(doc, ("initial_prompt_file",), got.by_ref[("initial_prompt_file",)], reader)
        errors += [issue] if issue else []
    rows = None
    if spec.dataset is not None:
        rows, problems = _dataset(doc, spec, got, reader)
        errors += problems
    bundle, issue = _bundle(doc, got.files, max_bytes)
    errors += [issue] if issue else []
    if errors or bundle is None:
        return None, errors, warnings
    task = LoadedTask(
        spec=spec,
        task_id=spec.task_id,
        prompt=prompt,
        source_yaml=doc.text,
        source_path=Path(doc.shown),
        yaml_path_in_bundle=got.yaml_key,
        files=got.files,
        bundle=bundle,
        dataset_rows=rows,
        warnings=warnings,
    )
    return task, [], warnings


def _script_issues(doc: Doc, spec: TaskSpec, got: _Collected) -> list[SpecIssue]:
    """The scripts a container task runs from its folders must be there."""
    issues = []
    for i, crit in enumerate(spec.success_criteria):
        if isinstance(crit, Verifier):
            folder = got.by_ref[("success_criteria", i, "tests_dir")]
            if not os.path.isfile(os.path.join(folder, crit.script)):
                shown = doc.root.shown(os.path.join(folder, crit.script))
                issues.append(doc.issue(("success_criteria", i, "script"), f"file not found: {shown}"))
    reference = spec.reference
    if reference is not None and reference.script is not None:
        folder = got.by_ref[("reference", "directory")]
        if not os.path.isfile(os.path.join(folder, reference.script)):
            shown = doc.root.shown(os.path.join(folder, reference.script))
            issues.append(doc.issue(("reference", "script"), f"file not found: {shown}"))
    return issues


def _load_harbor(
    folder: str, root: Root, reader: _Files, max_bytes: int, lenient: bool
) -> tuple[LoadedTask | None, harbor.TomlDoc | None, list[SpecIssue], list[SpecIssue]]:
    """A Harbor task folder as a task: its task.toml checked and turned into a task spec, its
    bundle the whole folder (so the folder's digest is the task's version)."""
    doc, issue = harbor.read_task_toml(Path(folder, harbor.TASK_FILE), root)
    if doc is None:
        return None, None, [issue] if issue else [], []
    found = harbor.harbor_task(doc, lenient=lenient)
    if found.data is None:
        return None, doc, found.errors, found.warnings
    try:
        spec = TaskSpec.model_validate(found.data)
    except ValidationError as exc:
        return None, doc, harbor.spec_issues(doc, exc, found.origins), found.warnings
    everything = _Ref((), ".", "dir")
    members, errors = _dir_files(doc, everything, folder)
    context = os.path.join(folder, "environment")
    if spec.sandbox.docker.dockerfile_path is not None:
        errors += _dir_files(doc, _Ref((), "environment", "dir"), context, links=False)[1]
    keys = {Path(os.path.relpath(m, folder)).as_posix(): m for m in members}
    sizes = {key: os.path.getsize(m) for key, m in keys.items()}
    if not errors and sum(sizes.values()) > max_bytes:
        errors.append(SpecIssue(doc.shown, None, "", too_large_message(sizes, max_bytes)))
    if errors:
        return None, doc, errors, found.warnings
    files = {key: reader.read(m) for key, m in sorted(keys.items())}
    try:
        prompt = files[harbor.INSTRUCTION].decode("utf-8").strip()
    except UnicodeDecodeError:
        shown = doc.root.shown(os.path.join(folder, harbor.INSTRUCTION))
        return None, doc, [SpecIssue(shown, None, "", "the file is not UTF-8 text")], found.warnings
    bundle, issue = _bundle(doc, files, max_bytes)
    if bundle is None:
        return None, doc, [issue] if issue else [], found.warnings
    task = LoadedTask(
        spec=spec,
        task_id=spec.task_id,
        prompt=prompt,
        source_yaml=doc.text,
        source_path=Path(doc.shown),
        yaml_path_in_bundle=harbor.TASK_FILE,
        files=files,
        bundle=bundle,
        warnings=found.warnings,
    )
    return task, doc, [], found.warnings


def _duplicate_ids(loaded: list[tuple[LoadedTask, Doc | harbor.TomlDoc]]) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    first: dict[str, SpecIssue] = {}
    for task, doc in loaded:
        if isinstance(doc, harbor.TomlDoc):  # a Harbor task's id is its folder's name
            here = SpecIssue(doc.shown, None, "", "")
        else:
            here = doc.issue(("task_id",), "")
        other = first.setdefault(task.task_id, here)
        if other is not here:
            where = other.file if other.line is None else f"{other.file}:{other.line}"
            msg = f"duplicate task_id {task.task_id!r}: also defined in {where}"
            issues.append(SpecIssue(here.file, here.line, here.field, msg))
    return issues


# --- experiments -------------------------------------------------------------------------------


def load_experiment(
    path: Path,
    root: Path | None = None,
    max_bundle_bytes: int = DEFAULT_MAX_BYTES,
    *,
    lenient: bool = False,
) -> ExperimentLoadResult:
    """Load one experiment YAML; its variants' overlay folders and prompt files go in its bundle."""
    path = Path(path)
    result = ExperimentLoadResult()
    this_root = Root.of(root if root is not None else path.parent)
    if not path.is_file():
        result.errors.append(SpecIssue(str(path), None, "", "no such file"))
        return result
    doc, issue = parse_yaml(path, this_root)
    if doc is None:
        result.errors.append(issue)  # type: ignore[arg-type]
        return result
    if not isinstance(doc.data, dict):
        result.errors.append(
            _not_a_mapping(doc, "a mapping of experiment fields (experiment_id, variants, ...)")
        )
        return result
    if "experiment_id" not in doc.data and "task_id" in doc.data:
        result.errors.append(
            doc.issue(("task_id",), "this is a task file; expected an experiment (experiment_id)")
        )
        return result
    try:
        spec = ExperimentSpec.model_validate(doc.data)
    except ValidationError as exc:
        result.errors += validation_issues(doc, exc)
        return result
    unknown = unknown_key_warnings(doc, spec, lenient)
    if not lenient and unknown:
        result.errors += unknown
        return result
    result.warnings = unknown
    refs = layer_refs(spec.defaults, ("defaults",))
    for j, variant in enumerate(spec.variants):
        refs += layer_refs(variant, ("variants", j))
    reader = _Files()
    got, errors = _collect(doc, refs, reader, max_bundle_bytes)
    if got is None:
        result.errors += errors
        return result
    prompts = {}
    for j, variant in enumerate(spec.variants):
        if variant.initial_prompt_file is not None:
            loc = ("variants", j, "initial_prompt_file")
            prompts[variant.variant_id], issue = _text(doc, loc, got.by_ref[loc], reader)
            result.errors += [issue] if issue else []
        elif variant.initial_prompt is not None:
            prompts[variant.variant_id] = variant.initial_prompt
    bundle, issue = _bundle(doc, got.files, max_bundle_bytes)
    if issue or bundle is None or result.errors:
        result.errors += [issue] if issue else []
        return result
    result.experiment = LoadedExperiment(
        spec=spec,
        experiment_id=spec.experiment_id,
        source_yaml=doc.text,
        source_path=Path(doc.shown),
        yaml_path_in_bundle=got.yaml_key,
        files=got.files,
        bundle=bundle,
        variant_prompts=prompts,
        warnings=result.warnings,
    )
    return result
