import pytest
import yaml
from django.contrib.auth.models import Group
from django.urls import reverse

from experiments_app.definitions import experiment_spec_data, import_experiment
from experiments_app.models import Experiment, Variant
from experiments_app.tests.factories import EXAMPLES, smoke_experiment

pytestmark = pytest.mark.django_db


def _variant(i: int, variant_id: str, agent_type: str = "", **fields: str) -> dict:
    values = {"variant_id": variant_id, "agent_type": agent_type, "description": "", "model": "",
              "base_url": "", "options": "", "prompt_prefix": "", "prompt_suffix": "", "run_limits": "",
              "repeats": "",
              "other": "", **fields}  # fmt: skip
    return {f"variants-{i}-{key}": value for key, value in values.items()}


def _form_data(*variants: dict, initial_forms: int = 0, **fields) -> dict:
    data = {
        "experiment_id": "ab-test", "name": "A/B test", "description": "oracle vs none",
        "include_tags": "smoke", "exclude_tags": "", "repeats": "1", "max_parallel": "3",
        "baseline": "", "run_limits": "task_timeout: 60\n", "other_defaults": "", "gates": "",
        "variants-TOTAL_FORMS": str(len(variants)), "variants-INITIAL_FORMS": str(initial_forms),
        "variants-MIN_NUM_FORMS": "0", "variants-MAX_NUM_FORMS": "1000",
    }  # fmt: skip
    for variant in variants:
        data.update(variant)
    data.update(fields)
    return data


def _two_variants(**second) -> tuple[dict, dict]:
    return _variant(0, "reference", "oracle"), _variant(1, "no-op", "none", **second)


def _post_data_of(response) -> dict:
    """What the browser would send back for an unchanged edit form."""
    data = {}
    forms = [
        response.context["form"],
        response.context["formset"].management_form,
        *response.context["formset"],
    ]
    for form in forms:
        for field in form:
            value = field.value()
            if value is None or field.field.disabled:
                continue
            data[field.html_name] = [str(v) for v in value] if isinstance(value, list) else str(value)
    return data


@pytest.mark.parametrize("url", ["experiment_create", "experiment_matching_tasks"])
def test_it_sends_anonymous_visitors_to_login(client, url):
    response = client.get(reverse(url))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("name", ["experiment_duplicate", "experiment_edit"])
def test_it_does_not_let_anonymous_visitors_change_anything(client, name):
    smoke_experiment()

    response = client.post(reverse(name, args=["smoke"]), {"description": "changed"})

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    assert Experiment.objects.count() == 1
    assert Experiment.objects.get().description != "changed"


def test_it_lets_a_member_create_an_experiment_with_two_variants(member_client, member):
    smoke_experiment()
    data = _form_data(*_two_variants(prompt_prefix="Be brief.", options="env: {A: '1'}\n", repeats="2"))

    response = member_client.post(reverse("experiment_create"), data)

    assert response.status_code == 302, response.context and response.context["form"].errors
    experiment = Experiment.objects.get(slug="ab-test")
    assert response["Location"] == experiment.get_absolute_url()
    assert experiment.name == "A/B test" and experiment.created_by == member
    assert experiment.include_tags == ["smoke"]
    assert experiment.defaults == {"run_limits": {"task_timeout": 60}, "repeats": 1}
    assert experiment.max_parallel == 3
    assert experiment.baseline.slug == "reference"  # the first variant when none is named
    reference, noop = experiment.variants.order_by("position")
    assert reference.agent == {"type": "oracle"}
    assert noop.agent == {"env": {"A": "1"}, "type": "none"}
    assert noop.prompt_mutations == [{"type": "prefix", "content": "Be brief."}]
    assert noop.repeats == 2
    assert experiment.selected_tasks().count() == 3


def test_a_variant_may_name_its_model_server_in_the_form(member_client):
    smoke_experiment()
    variants = (
        _variant(0, "reference", "oracle"),
        _variant(1, "local", "claude-code", base_url="http://10.0.0.5:8080"),
    )

    response = member_client.post(reverse("experiment_create"), _form_data(*variants))

    assert response.status_code == 302, response.context and response.context["form"].errors
    local = Experiment.objects.get(slug="ab-test").variants.get(slug="local")
    assert local.agent == {"type": "claude-code", "base_url": "http://10.0.0.5:8080"}
    page = member_client.get(reverse("experiment_edit", args=["ab-test"])).content.decode()
    assert 'value="http://10.0.0.5:8080"' in page
    bad = _variant(1, "local", "claude-code", base_url="not a url")
    response = member_client.post(reverse("experiment_create"), _form_data(variants[0], bad))
    assert response.status_code == 200 and "Enter a valid URL" in response.content.decode()


def test_it_ignores_blank_extra_variant_forms(member_client):
    smoke_experiment()
    blank = _variant(2, "", "")
    data = _form_data(*_two_variants(), blank)

    response = member_client.post(reverse("experiment_create"), data)

    assert response.status_code == 302
    assert Variant.objects.filter(experiment__slug="ab-test").count() == 2


@pytest.mark.parametrize(
    ("change", "form_name", "field", "message"),
    [
        ({"experiment_id": "Not Kebab"}, "form", "experiment_id", "must be kebab-case"),
        ({"experiment_id": "new"}, "form", "experiment_id", "reserved"),
        ({"experiment_id": "smoke"}, "form", "experiment_id", "exists"),
        ({"baseline": "nope"}, "form", "baseline", "no variant 'nope'"),
        ({"max_parallel": "0"}, "form", "max_parallel", "greater than or equal to 1"),
        ({"run_limits": "task_timeout: 5"}, "form", "run_limits", "task_timeout: Input should be greater"),
        ({"run_limits": "[1, 2]"}, "form", "run_limits", "expected a mapping"),
        ({"run_limits": "a: [1"}, "form", "run_limits", "not valid YAML"),
        ({"variants-1-variant_id": "reference"}, 1, "variant_id", "duplicate variant_id 'reference'"),
        ({"variants-1-variant_id": "bad id"}, 1, "variant_id", "must be a slug"),
        ({"variants-1-run_limits": "max_usd: -1"}, 1, "run_limits", "max_usd: Input should be greater"),
        ({"variants-1-agent_type": "robot"}, 1, "agent_type", "Select a valid choice"),
        (
            {"variants-1-other": "initial_prompt: hi\nprompt_mutations: [{type: suffix, content: x}]"},
            1,
            "other",
            "set only one of",
        ),
        ({"variants-1-options": "script: agent.py"}, 1, "options", "applies to command, not to none"),
        ({"variants-1-options": "base_ur: http://x"}, 1, "options", "no agent kind has an option 'base_ur'"),
    ],
)
def test_it_shows_the_importers_errors_on_the_fields(member_client, change, form_name, field, message):
    smoke_experiment()

    response = member_client.post(reverse("experiment_create"), _form_data(*_two_variants(), **change))

    assert response.status_code == 200
    form = response.context["form"] if form_name == "form" else response.context["formset"][form_name]
    assert any(message in error for error in form.errors.get(field, [])), form.errors
    assert not Experiment.objects.filter(slug="ab-test").exists()


def test_it_needs_at_least_one_variant(member_client):
    smoke_experiment()

    response = member_client.post(reverse("experiment_create"), _form_data())

    assert response.status_code == 200
    assert any("at least 1" in e for e in response.context["formset"].non_form_errors())


def test_it_edits_an_imported_experiment_without_losing_what_the_form_does_not_show(member_client):
    experiment = smoke_experiment()
    Variant.objects.filter(experiment=experiment, slug="no-op").update(
        overrides={"initial_prompt": "Do nothing."}, agent={"type": "none", "env": {"X": "1"}}
    )
    before = experiment_spec_data(experiment)
    page = member_client.get(reverse("experiment_edit", args=["smoke"]))
    data = _post_data_of(page)
    data["description"] = "edited in the browser"

    response = member_client.post(reverse("experiment_edit", args=["smoke"]), data)

    assert response.status_code == 302, response.context and response.context["formset"].errors
    after = experiment_spec_data(Experiment.objects.get(slug="smoke"))
    assert after["description"] == "edited in the browser"
    assert {**after, "description": before["description"]} == before


def test_it_counts_the_matching_tasks_live(member_client):
    smoke_experiment()
    url = reverse("experiment_matching_tasks")

    smoke = member_client.get(url, {"include_tags": "smoke"}, HTTP_HX_REQUEST="true")
    everything = member_client.get(url, {"task_sets": "examples"}, HTTP_HX_REQUEST="true")
    unknown_set = member_client.get(url, {"task_sets": "nope"}, HTTP_HX_REQUEST="true")

    assert b"<strong>3</strong> tasks match" in smoke.content
    assert b"<html" not in smoke.content  # only the fragment
    assert b"<strong>14</strong> tasks match" in everything.content
    assert b"Check the task selection" in unknown_set.content


def test_it_duplicates_an_experiment_for_editing(member_client, member):
    original = smoke_experiment()

    response = member_client.post(reverse("experiment_duplicate", args=["smoke"]))
    member_client.post(reverse("experiment_duplicate", args=["smoke"]))

    copy = Experiment.objects.get(slug="smoke-copy")
    assert response["Location"] == reverse("experiment_edit", args=["smoke-copy"])
    assert Experiment.objects.filter(slug="smoke-copy-2").exists()
    assert copy.created_by == member
    data, original_data = experiment_spec_data(copy), experiment_spec_data(original)
    assert {**data, "experiment_id": "smoke"} == original_data
    assert copy.baseline.experiment == copy


def test_it_downloads_yaml_that_imports_back_to_the_same_experiment(member_client, member, tmp_path):
    smoke_experiment()
    member.groups.add(Group.objects.create(name="agent-authors"))  # the variant defines a command
    extra = {"prompt_suffix": "Run the tests.", "options": "command: [python3, -c, 'print(1)']\n",
             "run_limits": "max_turns: 5\n", "repeats": "3",
             "other": "post_run:\n  - command: 'true'\n"}  # fmt: skip
    gates = "- {type: min_pass_rate, value: 0.5, variant: reference}\n"
    variants = (_variant(0, "reference", "oracle"), _variant(1, "no-op", "command", **extra))
    member_client.post(
        reverse("experiment_create"), _form_data(*variants, task_sets=["examples"], gates=gates)
    )
    made = Experiment.objects.get(slug="ab-test")
    before = experiment_spec_data(made)

    response = member_client.get(reverse("experiment_yaml", args=["ab-test"]))
    made.delete()
    path = tmp_path / "ab-test.yaml"
    path.write_bytes(response.content)
    imported = import_experiment(path).experiment

    assert response["Content-Disposition"] == 'attachment; filename="ab-test.yaml"'
    assert yaml.safe_load(response.content)["experiment_id"] == "ab-test"
    assert experiment_spec_data(imported) == before
    assert before["variants"][1]["prompt_mutations"] == [{"type": "suffix", "content": "Run the tests."}]
    assert before["gates"][0]["variant"] == "reference"


def test_only_staff_and_agent_authors_define_command_agents(member_client, member):
    smoke_experiment()
    command = _variant(1, "no-op", "command", options="command: [sh, -c, id]\n")
    data = _form_data(_variant(0, "reference", "oracle"), command)

    refused = member_client.post(reverse("experiment_create"), data)
    member.groups.add(Group.objects.create(name="agent-authors"))
    allowed = member_client.post(reverse("experiment_create"), data)

    assert refused.status_code == 200
    assert "may define a command agent or name agent secrets (no-op)" in str(refused.context["form"].errors)
    assert allowed.status_code == 302 and Experiment.objects.filter(slug="ab-test").exists()


def test_a_member_edits_an_experiment_with_a_command_agent_without_changing_it(member_client):
    smoke_experiment()  # the example tasks; the demo's `scripted` arm is a command agent
    import_experiment(EXAMPLES / "experiments" / "demo.yaml", root=EXAMPLES)
    page = member_client.get(reverse("experiment_edit", args=["demo"]))
    edit = {**_post_data_of(page), "description": "edited by a member"}

    response = member_client.post(reverse("experiment_edit", args=["demo"]), edit)

    assert response.status_code == 302, response.context and response.context["form"].errors
    assert Experiment.objects.get(slug="demo").description == "edited by a member"


def test_it_reports_field_and_importer_errors_together_in_one_pass(member_client):
    smoke_experiment()
    data = _form_data(
        _variant(0, "reference", "oracle"),
        _variant(1, "reference", "none", run_limits="a: [1"),  # bad YAML and a duplicate id
        baseline="nope",
        max_parallel="0",
    )

    response = member_client.post(reverse("experiment_create"), data)

    form, second = response.context["form"], response.context["formset"][1]
    assert any("not valid YAML" in e for e in second.errors["run_limits"])  # the field's own check
    assert any("duplicate variant_id 'reference'" in e for e in second.errors["variant_id"])  # the spec's
    assert any("no variant 'nope'" in e for e in form.errors["baseline"])
    assert any("greater than or equal to 1" in e for e in form.errors["max_parallel"])
    assert not Experiment.objects.filter(slug="ab-test").exists()


def test_a_typo_in_a_form_field_is_refused_as_the_importer_refuses_it(member_client):
    smoke_experiment()
    data = _form_data(*_two_variants(run_limits="max_turn: 5"))

    response = member_client.post(reverse("experiment_create"), data)

    errors = response.context["formset"][1].errors["run_limits"]
    assert any("unknown key 'max_turn'; did you mean 'max_turns'?" in e for e in errors), errors
    assert not Experiment.objects.filter(slug="ab-test").exists()


def test_the_form_sums_up_every_problem_at_the_top(member_client):
    smoke_experiment()
    data = _form_data(*_two_variants(run_limits="max_turn: 5"), baseline="nope")

    response = member_client.post(reverse("experiment_create"), data)

    problems = response.context["problems"]
    assert len(problems) == 2 and 'data-testid="form-problems"' in response.content.decode()
    assert any(p.startswith("Baseline") or "baseline" in p.lower() for p in problems)
    assert any(p.startswith("variant 2 ·") and "max_turn" in p for p in problems)


def test_a_command_variant_without_a_command_is_refused(admin_client):
    smoke_experiment()
    data = _form_data(_variant(0, "reference", "oracle"), _variant(1, "mine", "command"))

    response = admin_client.post(reverse("experiment_create"), data)

    errors = response.context["formset"][1].errors
    # Under the Command field, where it is to be typed (not under Agent options).
    assert any("a command agent needs `command:`" in e for e in errors.get("command", [])), errors
    assert "options" not in errors
    assert not Experiment.objects.filter(slug="ab-test").exists()


def test_ten_mistakes_are_all_reported_at_once(admin_client):
    smoke_experiment()
    data = _form_data(
        _variant(0, "", "oracle", run_limits="max_turn: 5"),  # a required id beside a typo
        _variant(1, "two", "none", options="base_ur: x", run_limits="max_usd: -1"),
        _variant(2, "three", "command", other="pre_rn: []"),  # no command, and a typo
        experiment_id="Bad ID", max_parallel="0", baseline="nope", repeats="0",
        run_limits="task_timout: 60", gates="- {type: min_pass_rate, valu: 0.8}",
    )  # fmt: skip

    response = admin_client.post(reverse("experiment_create"), data)

    form, variants = response.context["form"], response.context["formset"]
    expected = [
        (form, "experiment_id", "must be kebab-case"),
        (form, "repeats", "greater than or equal to 1"),
        (form, "max_parallel", "greater than or equal to 1"),
        (
            form,
            "baseline",
            "no variant 'nope'; expected one of: (variant 1, which has no ID yet), two, three",
        ),
        (form, "run_limits", "unknown key 'task_timout'; did you mean 'task_timeout'?"),
        (
            form,
            "gates",
            "0.valu: unknown key 'valu'; did you mean 'value'? (known here: cluster, name, overall",
        ),
        (variants[0], "variant_id", "This field is required."),
        (variants[0], "run_limits", "unknown key 'max_turn'; did you mean 'max_turns'?"),
        (variants[1], "options", "no agent kind has an option 'base_ur'"),
        (variants[1], "run_limits", "max_usd: Input should be greater than 0"),
        (variants[2], "other", "unknown key 'pre_rn'; did you mean 'pre_run'?"),
        (variants[2], "command", "a command agent needs `command:`"),
    ]
    for where, field, message in expected:
        assert any(message in e for e in where.errors.get(field, [])), (field, message, where.errors)
    assert not any("Extra inputs" in p for p in response.context["problems"])
    assert len(response.context["problems"]) == 13  # the gate's missing value too
    assert not Experiment.objects.filter(slug="ab-test").exists()


def test_typed_agent_fields_fill_the_agent_options_and_come_back_on_edit(admin_client):
    smoke_experiment()
    data = _form_data(
        _variant(0, "reference", "oracle"),
        _variant(1, "mine", "command", command="python3 agent.py", prompt_via="file"),
    )

    saved = admin_client.post(reverse("experiment_create"), data)

    assert saved.status_code == 302, saved.context and saved.context["problems"]
    variant = Experiment.objects.get(slug="ab-test").variants.get(slug="mine")
    assert variant.agent == {"type": "command", "command": "python3 agent.py", "prompt_via": "file"}
    edit = admin_client.get(reverse("experiment_edit", args=["ab-test"]))
    second = edit.context["formset"][1]
    assert second["command"].value() == "python3 agent.py" and second["options"].value() in (
        "",
        "{}",
        None,
        {},
    )

    clash = admin_client.post(
        reverse("experiment_create"),
        _form_data(
            _variant(0, "a", "command", command="true", options="command: false"), experiment_id="clash"
        ),
    )
    assert any(
        "set here and in the agent options" in e for e in clash.context["formset"][0].errors["command"]
    )


def test_each_kind_gets_typed_fields_for_its_common_options_with_their_types(admin_client):
    smoke_experiment()
    data = _form_data(
        _variant(0, "reference", "oracle"),
        _variant(1, "claude", "claude-code", allowed_tools="Read, Bash(git:*)", max_turns="7",
                 permission_mode="plan"),
        _variant(2, "codex", "codex", sandbox="read-only", reasoning_effort="high"),
    )  # fmt: skip

    saved = admin_client.post(reverse("experiment_create"), data)

    assert saved.status_code == 302, saved.context and saved.context["problems"]
    variants = Experiment.objects.get(slug="ab-test").variants
    assert variants.get(slug="claude").agent == {
        "type": "claude-code", "allowed_tools": ["Read", "Bash(git:*)"], "max_turns": 7,
        "permission_mode": "plan",
    }  # fmt: skip
    assert variants.get(slug="codex").agent == {
        "type": "codex",
        "sandbox": "read-only",
        "reasoning_effort": "high",
    }
    edit = admin_client.get(reverse("experiment_edit", args=["ab-test"]))
    claude, codex = edit.context["formset"][1], edit.context["formset"][2]
    assert (claude["allowed_tools"].value(), claude["max_turns"].value()) == ("Read, Bash(git:*)", 7)
    assert codex["reasoning_effort"].value() == "high" and not codex["options"].value()
    page = edit.content.decode()
    assert 'data-kinds="claude-code gemini-cli"' in page and 'data-kinds="codex"' in page
    bad = admin_client.post(
        reverse("experiment_create"),
        _form_data(_variant(0, "a", "codex", reasoning_effort="extreme"), experiment_id="bad-effort"),
    )
    assert "reasoning_effort" in bad.context["formset"][0].errors


def test_a_script_attached_in_the_form_joins_the_bundle_and_its_variant_may_name_it(admin_client):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from experiments_app.specs.bundles import read_bundle

    smoke_experiment()
    variant = _variant(1, "scripted", "command", command="python3 {script}", options="script: agent.py")
    data = _form_data(_variant(0, "reference", "oracle"), variant)

    refused = admin_client.post(reverse("experiment_create"), data)  # not attached: refused
    assert any("attach it below" in e for e in refused.context["formset"][1].errors["options"])

    attached = SimpleUploadedFile("agent.py", b"print('hi')\n")
    saved = admin_client.post(reverse("experiment_create"), {**data, "attachment": attached})

    assert saved.status_code == 302, saved.context and saved.context["problems"]
    experiment = Experiment.objects.get(slug="ab-test")
    assert read_bundle(bytes(experiment.bundle.data))["agent.py"] == b"print('hi')\n"
    assert experiment.variants.get(slug="scripted").agent["script"] == "agent.py"


def _attached(name: str = "agent.py"):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(name, b"open('out.txt', 'w').write('x')\n")


def test_a_file_attached_that_no_variant_uses_is_refused_with_how_to_use_it(admin_client):
    smoke_experiment()
    data = _form_data(_variant(0, "reference", "oracle"), _variant(1, "mine", "command", command="true"))

    refused = admin_client.post(reverse("experiment_create"), {**data, "attachment": _attached()})

    assert refused.status_code == 200 and not Experiment.objects.filter(slug="ab-test").exists()
    [error] = refused.context["form"].errors["attachment"]
    assert error.startswith("agent.py is attached but no variant uses it: choose it as a command variant's")
    assert "e.g. python3 {script}" in error


def test_a_command_naming_the_attached_file_is_refused_with_the_fix(admin_client):
    smoke_experiment()
    variant = _variant(1, "mine", "command", command="python3 agent.py", script="agent.py")
    data = _form_data(_variant(0, "reference", "oracle"), variant)

    refused = admin_client.post(reverse("experiment_create"), {**data, "attachment": _attached()})

    [error] = refused.context["formset"][1].errors["command"]
    assert "the command never says {script}, so the script agent.py would not run" in error
    assert not Experiment.objects.filter(slug="ab-test").exists()

    no_script = _variant(1, "mine", "command", command="python3 agent.py")
    refused = admin_client.post(
        reverse("experiment_create"),
        {**_form_data(_variant(0, "reference", "oracle"), no_script), "attachment": _attached()},
    )
    assert any(
        "agent.py is a file of the experiment, not of the task's workspace" in error
        for error in refused.context["formset"][1].errors["command"]
    )


def test_the_script_field_names_the_attachment_and_the_form_offers_it(admin_client):
    smoke_experiment()
    variant = _variant(1, "mine", "command", command="python3 {script}", script="agent.py")
    data = _form_data(_variant(0, "reference", "oracle"), variant)

    saved = admin_client.post(reverse("experiment_create"), {**data, "attachment": _attached()})

    assert saved.status_code == 302, saved.context and saved.context["problems"]
    experiment = Experiment.objects.get(slug="ab-test")
    assert experiment.variants.get(slug="mine").agent == {
        "type": "command", "command": "python3 {script}", "script": "agent.py",
    }  # fmt: skip
    edit = admin_client.get(reverse("experiment_edit", args=["ab-test"]))
    page = edit.content.decode()
    assert '<datalist id="experiment-files"><option value="agent.py"></datalist>' in page
    assert '<datalist id="command-suggestions"><option value="python3 {script}"></datalist>' in page
    assert edit.context["formset"][1]["script"].value() == "agent.py"
    # Saved again unchanged: no new attachment, and the stored one still counts as used.
    again = admin_client.post(reverse("experiment_edit", args=["ab-test"]), _post_data_of(edit))
    assert again.status_code == 302, again.context and again.context["problems"]
