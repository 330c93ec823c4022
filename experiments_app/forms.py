"""Experiment set-up in the browser.

The form is a front end to the YAML format: it builds the experiment as the dict a YAML file
would hold, validates it with the importer's `ExperimentSpec` and maps each problem back to the
field that caused it; `definitions.save_experiment` stores it the way `import_experiment` does.
So an experiment made here downloads as YAML that re-imports to the same experiment, and one
imported from YAML edits here without losing the keys the form has no field for (those sit in
the "other" YAML boxes).
"""

import copy
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from django import forms
from pydantic import ValidationError

from experiments_app.models import Experiment, Task, TaskSet, Variant
from experiments_app.specs import UNION_TAGS, ExperimentSpec, SpecError, agent_kinds, attachments
from experiments_app.specs.bundles import read_bundle
from experiments_app.specs.loading import layer_refs
from experiments_app.specs.providers import PROVIDERS
from experiments_app.specs.yaml_errors import (
    YamlRefused,
    extra_key_message,
    load_yaml,
    unknown_key_problems,
    value_at,
)

Loc = tuple[str | int, ...]
# Paths the create page owns below /experiments/, so no experiment may take these IDs.
RESERVED_IDS = frozenset({"new"})
# The prompt mutation a field edits when it is a plain prefix / suffix with the default separator.
SIMPLE_MUTATIONS = {"prefix": "prompt_prefix", "suffix": "prompt_suffix"}
DEFAULT_SEPARATOR = "\n\n"


# --- fields ---------------------------------------------------------------------------------


def dump_yaml(value: Any) -> str:
    """Block-style YAML for a text box ("" for nothing)."""
    if not value:
        return ""
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, default_flow_style=False)


class YamlField(forms.CharField):
    """A YAML (or JSON) text box holding a mapping or, with `kind=list`, a list."""

    widget = forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "class": "code"})

    def __init__(self, *args: Any, kind: type = dict, **kwargs: Any) -> None:
        self.kind = kind
        kwargs.setdefault("required", False)
        super().__init__(*args, strip=False, **kwargs)

    def prepare_value(self, value: Any) -> Any:
        return value if isinstance(value, str) else dump_yaml(value)

    def has_changed(self, initial: Any, data: Any) -> bool:
        # Compare what the text means: an untouched empty box is no change.
        try:
            new = self.to_python(data)
            old = self.to_python(initial) if isinstance(initial, str) else initial
        except forms.ValidationError:
            return True
        return (old or self.kind()) != new

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if not text.strip():
            return self.kind()
        try:
            data = load_yaml(text)
        except YamlRefused as exc:
            raise forms.ValidationError(f"refused: {exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark else ""
            raise forms.ValidationError(f"not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
        if data is None:
            return self.kind()
        if not isinstance(data, self.kind):
            what = "a mapping (`key: value` lines)" if self.kind is dict else "a list (`- item` lines)"
            raise forms.ValidationError(f"expected {what}, got a {type(data).__name__}")
        return data


def split_tags(text: str) -> list[str]:
    """Tags typed as "a, b c" -> ["a", "b", "c"] (order kept, duplicates dropped)."""
    return list(dict.fromkeys(part for part in text.replace(",", " ").split() if part))


def agent_kind_choices() -> list[tuple[str, str]]:
    return [("", "(from defaults)"), *((kind, kind) for kind in agent_kinds.known_kinds())]


ATTACHMENT_MAX_BYTES = 1 << 20


class ExperimentForm(forms.Form):
    experiment_id = forms.CharField(
        label="ID", max_length=200, help_text="kebab-case, e.g. model-comparison (the YAML's experiment_id)"
    )
    name = forms.CharField(max_length=200, required=False, help_text="Shown instead of the ID")
    attachment = forms.FileField(
        required=False,
        label="Attach a file",
        help_text="A script or prompt file a variant names: a command variant's Script (its command "
        "then runs it as {script}); it joins the experiment's files",
    )

    def clean_attachment(self):
        upload = self.cleaned_data.get("attachment")
        if upload is None:
            return None
        name = upload.name.rsplit("/", 1)[-1]
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or name.endswith((".yaml", ".yml")):
            raise forms.ValidationError(
                "name the file with letters, digits, '.', '_' or '-' (not a YAML file)"
            )
        if upload.size > ATTACHMENT_MAX_BYTES:
            raise forms.ValidationError(f"at most {ATTACHMENT_MAX_BYTES // 1024} KB")
        return {name: upload.read()}

    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    task_sets = forms.ModelMultipleChoiceField(
        queryset=TaskSet.objects.order_by("name"),
        to_field_name="name",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every task",
    )
    include_tags = forms.CharField(required=False, help_text="Any of these tags; empty: every task")
    exclude_tags = forms.CharField(required=False, help_text="None of these tags")
    repeats = forms.IntegerField(initial=1, help_text="Trials per task and variant")
    max_parallel = forms.IntegerField(initial=4, label="Max parallel", help_text="Trials running at once")
    baseline = forms.CharField(
        required=False,
        help_text="One of the variants below; empty: the first variant",
        widget=forms.TextInput(attrs={"list": "variant-ids", "autocomplete": "off"}),
    )
    run_limits = YamlField(
        label="Run limits",
        help_text="Defaults for every variant, e.g. task_timeout: 300, max_turns: 30, max_usd: 2",
    )
    other_defaults = YamlField(label="Other defaults", help_text="Any other task-level field (YAML)")
    gates = YamlField(
        kind=list, help_text="Checks judged when a run ends, e.g. - {type: min_pass_rate, value: 0.8}"
    )

    def __init__(self, *args: Any, editing: Experiment | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.editing = editing
        if editing is not None:
            # The ID names the experiment in URLs, runs and its YAML: duplicate to get a new one.
            self.fields["experiment_id"].disabled = True

    def clean_experiment_id(self) -> str:
        value = self.cleaned_data["experiment_id"].strip()
        if self.editing is None:
            if value in RESERVED_IDS:
                raise forms.ValidationError(f"{value!r} is reserved; pick another ID")
            if Experiment.objects.filter(slug=value).exists():
                raise forms.ValidationError("an experiment with this ID exists; pick another ID")
        return value


# Agent options with a field of their own, and the kinds that read them: the page shows each
# field for those kinds only.
TYPED_OPTIONS = {
    name: agent_kinds.kinds_reading(name)
    for name in ("permission_mode", "allowed_tools", "max_turns", "sandbox", "reasoning_effort", "command",
                 "script", "prompt_via")
}  # fmt: skip
# Typed options whose value is a list, typed as "a, b".
LIST_OPTIONS = ("allowed_tools",)


def _model_server_help() -> str:
    """Which worker variables a variant's model server and key come from, by kind."""
    by_provider: dict[str, list[str]] = {}
    for kind in agent_kinds.KINDS.values():
        if kind.cli:
            by_provider.setdefault(kind.providers[0], []).append(kind.name)
    rows = [PROVIDERS[name] for name in by_provider]
    urls = " / ".join(row.url_variable for row in rows)
    keys = ", ".join(f"{row.key_variable} ({', '.join(by_provider[row.name])})" for row in rows)
    return (
        f"Base URL of the model API this variant's agent calls through the gateway; empty: the worker's "
        f"{urls}, else the public API. The key is the worker's {keys}: keys never leave the worker."
    )


class VariantForm(forms.Form):
    variant_id = forms.CharField(label="ID", max_length=200)
    description = forms.CharField(required=False)
    agent_type = forms.ChoiceField(label="Agent kind", required=False, choices=())
    model = forms.CharField(required=False, max_length=200)
    base_url = forms.URLField(
        required=False,
        max_length=500,
        label="Model server",
        assume_scheme="https",
        help_text=_model_server_help(),
    )
    # Typed fields for the options people set most; any other option goes in "Agent options".
    permission_mode = forms.ChoiceField(
        required=False,
        label="Permission mode",
        choices=[
            ("", "default (acceptEdits)"),
            ("acceptEdits", "acceptEdits"),
            ("bypassPermissions", "bypassPermissions"),
            ("default", "default"),
            ("plan", "plan"),
        ],  # fmt: skip
    )
    allowed_tools = forms.CharField(
        required=False, max_length=2000, label="Allowed tools",
        help_text="Comma-separated, e.g. Read, Edit, Bash; empty: the kind's default set",
    )  # fmt: skip
    max_turns = forms.IntegerField(required=False, min_value=1, label="Max turns")
    sandbox = forms.ChoiceField(
        required=False,
        label="Codex sandbox",
        choices=[("", "default (workspace-write)"), ("read-only", "read-only"),
                 ("workspace-write", "workspace-write"), ("danger-full-access", "danger-full-access")],
    )  # fmt: skip
    reasoning_effort = forms.ChoiceField(
        required=False,
        label="Reasoning effort",
        choices=[("", "the model's default"), *((v, v) for v in ("minimal", "low", "medium", "high"))],
    )
    command = forms.CharField(
        required=False,
        max_length=2000,
        label="Command",
        help_text="What to run, with sh -c; {script} stands for the script below, e.g. python3 {script}",
        widget=forms.TextInput(attrs={"list": "command-suggestions", "autocomplete": "off"}),
    )
    script = forms.CharField(
        required=False,
        max_length=500,
        help_text="A file of the experiment (attach it above) that the command runs as {script}",
        widget=forms.TextInput(attrs={"list": "experiment-files", "autocomplete": "off"}),
    )
    prompt_via = forms.ChoiceField(
        required=False,
        label="Prompt delivery",
        choices=[("", "stdin (default)"), ("stdin", "stdin"), ("file", "file")],
    )
    options = YamlField(
        label="Agent options", help_text="Any other option of the kind, e.g. append_system_prompt: … (YAML)"
    )
    prompt_prefix = forms.CharField(
        required=False, strip=False, widget=forms.Textarea(attrs={"rows": 2}), label="Prompt prefix"
    )
    prompt_suffix = forms.CharField(
        required=False, strip=False, widget=forms.Textarea(attrs={"rows": 2}), label="Prompt suffix"
    )
    run_limits = YamlField(label="Run limits")
    repeats = forms.IntegerField(required=False, help_text="Empty: the experiment's")
    other = YamlField(label="Other settings", help_text="Any other task-level field this variant sets")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["agent_type"].choices = agent_kind_choices()

    def clean(self) -> dict:
        data = super().clean()
        options = data.get("options") or {}
        for name in TYPED_OPTIONS:
            if data.get(name) and name in options:
                self.add_error(name, f"{name} is set here and in the agent options: keep one")
        return data


VariantFormSet = forms.formset_factory(VariantForm, extra=0, can_delete=True)


class TaskSelectionForm(forms.Form):
    """The task selection part of the experiment form, for the live count of matching tasks."""

    task_sets = forms.ModelMultipleChoiceField(
        queryset=TaskSet.objects.all(), to_field_name="name", required=False
    )
    include_tags = forms.CharField(required=False)
    exclude_tags = forms.CharField(required=False)


def matching_tasks(task_sets: list[str], include: list[str], exclude: list[str]):
    """The tasks a run would select: `Experiment.selected_tasks` without an experiment."""
    tasks = Task.objects.active()
    if task_sets:
        tasks = tasks.filter(task_sets__name__in=task_sets).distinct()
    return tasks.with_tags(include, exclude).order_by("slug")


# --- experiment <-> form data ------------------------------------------------------------


def experiment_initial(experiment: Experiment) -> tuple[dict, list[dict]]:
    """Initial data of the experiment form and of one variant form per variant."""
    defaults = dict(experiment.defaults)
    defaults.pop("repeats", None)
    initial = {
        "experiment_id": experiment.slug,
        "name": experiment.name,
        "description": experiment.description,
        "task_sets": list(experiment.task_sets.all()),
        "include_tags": ", ".join(experiment.include_tags),
        "exclude_tags": ", ".join(experiment.exclude_tags),
        "repeats": experiment.repeats,
        "max_parallel": experiment.max_parallel,
        "baseline": experiment.baseline.slug if experiment.baseline else "",
        "run_limits": defaults.pop("run_limits", {}),
        "other_defaults": defaults,
        "gates": experiment.gates,
    }
    return initial, [variant_initial(v) for v in experiment.variants.order_by("position", "pk")]


def _typed_initial(agent: dict) -> dict:
    """The typed options of a saved agent, taken out of it (what stays goes in "Agent options");
    a value of a shape the field cannot show (a list of dicts, a string list option) stays there."""
    typed = {}
    for name in TYPED_OPTIONS:
        value = agent.get(name)
        if name in LIST_OPTIONS:
            shown = isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif name == "max_turns":
            shown = isinstance(value, int) and not isinstance(value, bool)
        else:
            shown = isinstance(value, str)
        if shown:
            value = agent.pop(name)
            typed[name] = ", ".join(value) if name in LIST_OPTIONS else value
    return typed


def variant_initial(variant: Variant) -> dict:
    agent = dict(variant.agent)
    initial = {
        "variant_id": variant.slug,
        "description": variant.description,
        "agent_type": agent.pop("type", "") or "",
        "model": agent.pop("model", "") or "",
        "base_url": agent.pop("base_url", "") or "",
        **_typed_initial(agent),
        "options": agent,
        "run_limits": variant.run_limits,
        "repeats": variant.repeats,
        "prompt_prefix": "",
        "prompt_suffix": "",
    }
    other_mutations = []
    for mutation in variant.prompt_mutations:
        name = SIMPLE_MUTATIONS.get(mutation.get("type"))
        simple = set(mutation) <= {"type", "content", "separator"}
        if (
            name
            and simple
            and not initial[name]
            and mutation.get("separator", DEFAULT_SEPARATOR) == DEFAULT_SEPARATOR
        ):
            initial[name] = mutation.get("content", "")
        else:
            other_mutations.append(mutation)
    other = dict(variant.overrides)
    if other_mutations:
        other["prompt_mutations"] = other_mutations
    initial["other"] = other
    return initial


@dataclass
class VariantSource:
    """Which form a spec variant came from, and which field each of its prompt mutations."""

    form: VariantForm
    mutation_fields: list[str] = field(default_factory=list)


def spec_data(form: ExperimentForm, variant_forms: list[VariantForm]) -> tuple[dict, list[VariantSource]]:
    """The experiment as the dict its YAML would hold (forms already cleaned)."""
    data = form.cleaned_data
    defaults = dict(data["other_defaults"])
    if data["run_limits"]:
        defaults["run_limits"] = data["run_limits"]
    if data["repeats"] is not None:  # (None: unreadable, see fill_unreadable; the default applies)
        defaults["repeats"] = data["repeats"]
    spec: dict[str, Any] = {
        "experiment_id": data["experiment_id"],
        "description": data["description"],
        "task_sets": [task_set.name for task_set in data["task_sets"]],
        "tags": split_tags(data["include_tags"]),
        "exclude_tags": split_tags(data["exclude_tags"]),
        **({"max_parallel": data["max_parallel"]} if data["max_parallel"] is not None else {}),
        "defaults": defaults,
        "variants": [],
    }
    if data["baseline"].strip():
        spec["baseline"] = data["baseline"].strip()
    if data["gates"]:
        spec["gates"] = data["gates"]
    sources = []
    for variant_form in variant_forms:
        variant, source = _variant_data(variant_form)
        spec["variants"].append(variant)
        sources.append(source)
    return spec, sources


def _variant_data(form: VariantForm) -> tuple[dict, VariantSource]:
    data = form.cleaned_data
    variant = dict(data["other"])
    variant["variant_id"] = data["variant_id"].strip()
    if data["description"]:
        variant["description"] = data["description"]
    agent = dict(data["options"])
    if data["agent_type"]:
        agent["type"] = data["agent_type"]
    if data["model"].strip():
        agent["model"] = data["model"].strip()
    if data["base_url"]:
        agent["base_url"] = data["base_url"]
    for name in TYPED_OPTIONS:
        value = data.get(name)
        if name in LIST_OPTIONS and value:
            agent[name] = [item.strip() for item in value.split(",") if item.strip()]
        elif value not in (None, ""):
            agent[name] = value.strip() if isinstance(value, str) else value
    if agent:
        variant["agent"] = agent
    if data["run_limits"]:
        variant["run_limits"] = data["run_limits"]
    if data["repeats"] is not None:
        variant["repeats"] = data["repeats"]
    source = VariantSource(form)
    mutations = []
    for kind, name in SIMPLE_MUTATIONS.items():
        if data[name]:
            mutations.append({"type": kind, "content": data[name]})
            source.mutation_fields.append(name)
    others = variant.pop("prompt_mutations", None)
    if isinstance(others, list):
        mutations += others
        source.mutation_fields += ["other"] * len(others)
    elif others is not None:
        mutations = others  # not a list: let the spec say what is wrong with it
    if mutations:
        variant["prompt_mutations"] = mutations
    return variant, source


# --- validation: the importer's rules, errors on the fields -------------------------------


# Enough rounds for the checks that wait for others: a field's own, then those across fields
# (the baseline, duplicate ids, gates naming variants), then the unknown keys.
VALIDATION_ROUNDS = 10


def validate_spec(data: dict) -> tuple[ExperimentSpec | None, list[tuple[Loc, str]]]:
    """The validated spec, or every problem as (location in the YAML, message), all in one pass:
    the importer's rules, unknown keys (`max_turn` in run limits) included.

    Pydantic reports a model's cross-field checks only once its fields are valid, and unknown keys
    are found on a valid spec: so each round sets aside what it reported (the value dropped, its
    default applies; a required id replaced by a stand-in) and validates again, until the rest is
    valid. Ten mistakes in the form came back as 6, then 3, then 1 before."""
    issues: list[tuple[Loc, str]] = []
    set_aside: list[Loc] = []
    for _ in range(VALIDATION_ROUNDS):
        try:
            spec = ExperimentSpec.model_validate(data)
        except ValidationError as exc:
            # (a value set aside on an earlier round may now be "missing": that is not news)
            found = [
                i
                for i in _issues(exc, data)
                if i not in issues and not any(i[0][: len(d)] == d for d in set_aside)
            ]
            issues += found
            data = copy.deepcopy(data)
            removed = [where for loc, _ in found if (where := _set_aside(data, loc)) is not None]
            if not removed:
                return None, issues
            set_aside += removed
            continue
        unknown = [issue for issue in unknown_key_problems(spec) if issue not in issues]
        return (None, _unstand(issues + unknown, data)) if issues or unknown else (spec, [])
    return None, _unstand(issues, data)


def _unstand(issues: list[tuple[Loc, str]], data: dict) -> list[tuple[Loc, str]]:
    """The problems, with a variant's stand-in id (`_set_aside`) named as the variant it is."""
    stand_ins = {
        f"'unnamed-{i + 1}'": f"(variant {i + 1}, which has no ID yet)"
        for i, variant in enumerate(data.get("variants") or [])
        if isinstance(variant, dict) and variant.get("variant_id") == f"unnamed-{i + 1}"
    }
    for stand_in, name in stand_ins.items():
        issues = [
            (loc, message.replace(stand_in, name).replace(stand_in.strip("'"), name))
            for loc, message in issues
        ]
    return issues


def _set_aside(data: dict, loc: Loc) -> Loc | None:
    """Take the value at `loc` out of `data`, or the nearest mapping key above it (a list item's
    problem takes its whole list: positions shift otherwise), so that validation can go on
    without it. An id that is required gets a stand-in instead (a variant keeps its position:
    positions name the forms). Returns what was set aside (None: nothing could be)."""
    if loc[:1] == ("experiment_id",):
        data["experiment_id"] = "unnamed"
        return ("experiment_id",)
    if len(loc) >= 3 and loc[0] == "variants" and isinstance(loc[1], int) and loc[2] == "variant_id":
        variants = data.get("variants")
        if isinstance(variants, list) and loc[1] < len(variants) and isinstance(variants[loc[1]], dict):
            variants[loc[1]]["variant_id"] = f"unnamed-{loc[1] + 1}"
            return loc[:3]
        return None
    for end in range(len(loc), 0, -1):
        where = loc[:end]
        if where[:1] == ("variants",) and end <= 2:
            return None  # a variant itself, or the list: never removed
        if isinstance(where[-1], int):
            continue
        parent = value_at(data, where[:-1])
        if isinstance(parent, dict) and where[-1] in parent:
            del parent[where[-1]]
            return where
    return None


def fill_unreadable(form: forms.Form) -> None:
    """Give each field that failed its own check a neutral value in `cleaned_data` (its raw text
    for a text field), so the spec can still be checked as a whole."""
    for name, form_field in form.fields.items():
        if name in form.cleaned_data:
            continue
        if isinstance(form_field, YamlField):
            form.cleaned_data[name] = form_field.kind()
        elif isinstance(form_field, forms.ModelMultipleChoiceField | forms.MultipleChoiceField):
            form.cleaned_data[name] = []
        elif isinstance(form_field, forms.IntegerField | forms.FloatField):
            form.cleaned_data[name] = None
        elif isinstance(form_field, forms.BooleanField):
            form.cleaned_data[name] = False
        elif isinstance(form_field, forms.FileField):
            form.cleaned_data[name] = None
        else:
            raw = form[name].value()
            form.cleaned_data[name] = raw.strip() if isinstance(raw, str) else ""


def _issues(exc: ValidationError, data: dict) -> list[tuple[Loc, str]]:
    issues: list[tuple[Loc, str]] = []
    for err in exc.errors():
        loc = tuple(part for part in err["loc"] if part not in UNION_TAGS)
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, SpecError):
            issues += [((*loc, *sub), msg) for sub, msg in cause.issues]
        elif err["type"] == "missing":
            issues.append((loc, "required field is missing"))
        elif (
            err["type"] == "extra_forbidden"
        ):  # a gate's typo: pydantic says "Extra inputs are not permitted"
            issues.append((loc, extra_key_message(data, loc)))
        elif err["type"] == "value_error":
            issues.append((loc, str(cause or err["msg"])))
        else:
            issues.append((loc, err["msg"]))
    return issues


def command_issues(data: dict) -> list[tuple[Loc, str]]:
    """A `command` variant must say what to run (in its options, or the experiment's defaults):
    saved without one, every trial of it would fail at setup. Read from the form's data, so it is
    reported with the other problems even when the spec has some."""
    defaults = data.get("defaults") or {}
    default_agent = defaults.get("agent") if isinstance(defaults.get("agent"), dict) else {}
    issues = []
    for i, variant in enumerate(data.get("variants") or []):
        agent = variant.get("agent") if isinstance(variant.get("agent"), dict) else {}
        kind = agent.get("type") or default_agent.get("type")
        if kind == "command" and not any(
            layer.get(key) for layer in (agent, default_agent) for key in ("command", "script")
        ):
            issues.append(
                (("variants", i, "agent", "command"), "a command agent needs `command:` (what to run, e.g. "
                 "python3 agent.py)")
            )  # fmt: skip
    return issues


def script_issues(data: dict, files: list[str]) -> list[tuple[int, str, str]]:
    """(variant index, option, message) for each command variant that would miss its script
    (`specs.attachments`): read from the form's data, with the experiment's `files` (names
    beside its YAML: attached now or before)."""
    defaults = data.get("defaults") or {}
    default_agent = defaults.get("agent") if isinstance(defaults.get("agent"), dict) else {}
    issues = []
    for i, variant in enumerate(data.get("variants") or []):
        agent = variant.get("agent") if isinstance(variant.get("agent"), dict) else {}
        merged = {**default_agent, **agent}
        if merged.get("type") == "command":
            issues += [(i, option, message) for option, message in attachments.script_problems(merged, files)]
    return issues


def unused_attachment_issues(spec: ExperimentSpec, attached: list[str]) -> list[str]:
    """An attached file no layer names would only sit in the bundle, and a command written to run
    it would not find it: refused, saying how to use it."""
    refs = layer_refs(spec.defaults, ("defaults",))
    for i, variant in enumerate(spec.variants):
        refs += layer_refs(variant, ("variants", i))
    return [
        f"{name} is attached but no variant uses it: choose it as a command variant's Script (its "
        f"command then runs it as {attachments.PLACEHOLDER}, e.g. {attachments.suggested_command(name)}), "
        "or do not attach it"
        for name in attachments.unused_files(attached, [ref.raw for ref in refs])
    ]


def file_reference_issues(
    spec: ExperimentSpec, experiment: Experiment | None, attached: list[str] | None = None
) -> list[tuple[Loc, str]]:
    """Files and folders a layer points to must travel in the experiment's bundle, which only a
    YAML import builds: the browser can keep the references an import brought, not add new ones."""
    refs = layer_refs(spec.defaults, ("defaults",))
    for i, variant in enumerate(spec.variants):
        refs += layer_refs(variant, ("variants", i))
    if not refs:
        return []
    bundled: set[str] = set()
    if experiment is not None and experiment.bundle_id:
        bundled = set(read_bundle(bytes(experiment.bundle.data)))
    base = experiment.yaml_path.rsplit("/", 1)[0] if experiment and "/" in experiment.yaml_path else ""
    bundled |= {f"{base}/{name}" if base else name for name in attached or []}
    issues = []
    for ref in refs:
        path = _normalise(f"{base}/{ref.raw}" if base else ref.raw)
        if path not in bundled and not any(name.startswith(path + "/") for name in bundled):
            issues.append(
                (
                    ref.loc,
                    f"{ref.raw!r} is not in this experiment's files: attach it below, or import the "
                    "experiment's YAML with its files (python manage.py import_experiment)",
                )  # fmt: skip
            )
    return issues


def _normalise(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts)


def in_use_issues(
    experiment: Experiment | None, sources: list[VariantSource], deleted: list[VariantForm]
) -> int:
    """Variants with trials cannot be removed or renamed (their runs point at them): put the
    error on the form that removes or renames one. Returns how many problems were found."""
    if experiment is None:
        return 0
    kept = {source.form.cleaned_data["variant_id"].strip() for source in sources}
    used = set(experiment.variants.filter(trials__isnull=False).values_list("slug", flat=True).distinct())
    problems = 0
    for form in [source.form for source in sources] + deleted:
        old = form.initial.get("variant_id")
        if old in used and old not in kept:
            action = "deleted" if form in deleted else "renamed"
            form.add_error(
                None, f"variant {old!r} has runs, so it cannot be {action}; add a new variant instead"
            )
            problems += 1
    return problems


def apply_issues(
    issues: list[tuple[Loc, str]],
    form: ExperimentForm,
    formset: forms.BaseFormSet,
    sources: list[VariantSource],
    skip_bad_fields: bool = False,
) -> None:
    """Show each spec problem on the field it came from (the whole form when none fits). With
    `skip_bad_fields`, a field that already failed its own check gets no second message (the
    spec read it as empty). (Only a field's own check counts: two spec problems of one field are
    both shown, a gate's missing value with the typo that caused it.)"""
    bad = {id(f): set(f.errors) if skip_bad_fields else set() for f in [form, *(s.form for s in sources)]}
    for loc, message in issues:
        if len(loc) >= 2 and loc[0] == "variants" and isinstance(loc[1], int) and loc[1] < len(sources):
            variant_form, name, rest = _variant_field(sources[loc[1]], loc[2:])
            if name not in bad[id(variant_form)]:
                variant_form.add_error(name, _with_path(rest, message))
        elif loc[:1] == ("variants",):
            formset._non_form_errors = formset.non_form_errors() + [f"variants: {message}"]
        else:
            name, rest = _experiment_field(loc)
            if name not in bad[id(form)]:
                form.add_error(name, _with_path(rest, message))


def _with_path(rest: Loc, message: str) -> str:
    path = ".".join(str(part) for part in rest)
    return f"{path}: {message}" if path else message


def _experiment_field(loc: Loc) -> tuple[str | None, Loc]:
    top = {"experiment_id": "experiment_id", "description": "description", "task_sets": "task_sets",
           "tags": "include_tags", "exclude_tags": "exclude_tags", "max_parallel": "max_parallel",
           "baseline": "baseline", "gates": "gates"}  # fmt: skip
    if loc and loc[0] in top:
        return top[loc[0]], loc[1:]
    if loc[:2] == ("defaults", "repeats"):
        return "repeats", ()
    if loc[:2] == ("defaults", "run_limits"):
        return "run_limits", loc[2:]
    if loc[:1] == ("defaults",):
        return "other_defaults", loc[1:]
    return None, loc


def _variant_field(source: VariantSource, loc: Loc) -> tuple[VariantForm, str | None, Loc]:
    form = source.form
    simple = {"variant_id": "variant_id", "description": "description", "run_limits": "run_limits",
              "repeats": "repeats"}  # fmt: skip
    if not loc:
        return form, None, loc
    if loc[0] in simple:
        return form, simple[loc[0]], loc[1:]
    if loc[0] == "agent":
        key = loc[1] if len(loc) > 1 else ""
        names = {"type": "agent_type", "model": "model", "base_url": "base_url"}
        if key in TYPED_OPTIONS and (
            form.cleaned_data.get(key) or key not in form.cleaned_data.get("options", {})
        ):
            # A typed option's problem goes under its field (the missing command under Command),
            # unless the agent options YAML is where it was written.
            names[key] = key
        name = names.get(key, "options")
        return form, name, loc[1:] if name == "options" else ()
    if loc[0] == "prompt_mutations" and len(loc) > 1 and isinstance(loc[1], int):
        if loc[1] < len(source.mutation_fields) and source.mutation_fields[loc[1]] != "other":
            return form, source.mutation_fields[loc[1]], loc[2:]
        return form, "other", loc
    return form, "other", loc


# --- launching, task sets, task lists -----------------------------------------------------------


class LaunchForm(forms.Form):
    """Optional one-off changes for a single run (the experiment itself stays as it is)."""

    repeats = forms.IntegerField(required=False, min_value=1, help_text="Empty: the experiment's")
    sample = forms.IntegerField(
        required=False, min_value=1, help_text="Run only this many tasks, drawn at random"
    )
    max_parallel = forms.IntegerField(required=False, min_value=1, label="Max parallel")
    overrides = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false", "class": "code"}),
        help_text="One path=value per line, e.g. run_limits.task_timeout=120",
    )
    variants = forms.CharField(
        required=False, max_length=2000, help_text="Only these variants, comma-separated; empty: all"
    )
    # Set by "Launch anyway": the pre-flight's problems were shown and accepted.
    confirm = forms.BooleanField(required=False, widget=forms.HiddenInput)

    def clean_overrides(self) -> list[str]:
        return [line.strip() for line in self.cleaned_data["overrides"].splitlines() if line.strip()]

    def clean_variants(self) -> list[str] | None:
        return split_tags(self.cleaned_data["variants"]) or None


class TaskSetForm(forms.ModelForm):
    """A set's name, description and whether it is archived (its tasks: TaskSetMembersForm)."""

    class Meta:
        model = TaskSet
        fields = ["name", "description", "archived"]
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}


class TaskSetMembersForm(forms.Form):
    """Add or remove the ticked tasks of the filtered list, all at once."""

    action = forms.ChoiceField(choices=[("add", "Add to the set"), ("remove", "Remove from the set")])
    tasks = forms.ModelMultipleChoiceField(queryset=Task.objects.all())


class ExperimentUploadForm(forms.Form):
    file = forms.FileField(
        help_text="An experiment's .zip (from its page's download), or a .yaml naming no files"
    )
    replace = forms.BooleanField(
        required=False, label="Replace an experiment of the same ID", help_text="Its runs are kept"
    )


class TaskUploadForm(forms.Form):
    file = forms.FileField(
        help_text="A task YAML file, or a .zip of a task folder (or a whole suite): coder-eval YAML tasks "
        "and Harbor task folders (task.toml, instruction.md, ...)"
    )


class TaskFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="Search")
    tag = forms.CharField(required=False, max_length=100)
    page = forms.IntegerField(required=False, min_value=1)
