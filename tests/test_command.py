from playbooks.core.command import Command, placeholder, shown


def test_argv_is_quoted_for_bash():
    c = Command(("gcloud", "x", "--format=value(projectNumber)", "a b", "it's"))
    assert c.line() == "gcloud x '--format=value(projectNumber)' 'a b' 'it'\"'\"'s'"


def test_placeholder_stays_expandable_and_the_rest_literal():
    c = Command(("tool", "--member", f"principal://p/{placeholder('PROJECT_NUMBER')}/x$y"))
    assert c.line() == 'tool --member "principal://p/${PROJECT_NUMBER}/x\\$y"'
    assert shown(placeholder("POD")) == "${POD}"


def test_a_literal_dollar_brace_is_single_quoted():
    c = Command(("envsubst", "${A} ${B}"), env=(("A", "1"), ("B", "x y")), stdin_file="m.yaml")
    assert c.line() == "A=1 B='x y' envsubst '${A} ${B}' < m.yaml"


def test_pipeline_background_and_binding():
    render = Command(("envsubst", "${A}"), env=(("A", "1"),), stdin_file="m.yaml")
    apply = Command(("kubectl", "apply", "-f", "-"), pipe_from=render)
    assert apply.line() == "A=1 envsubst '${A}' < m.yaml | kubectl apply -f -"
    bg = Command(("ray", "start"), env=(("TPU_NAME", "g-0"),), background=True, log="x.log")
    assert bg.line() == "TPU_NAME=g-0 nohup ray start > x.log 2>&1 &"
    assert Command(("a",), binds="POD").line() == "POD=$(a)"


def test_secrets_are_masked():
    assert Command(("curl", "-H", "token abc123"), secrets=("abc123",)).line() == "curl -H 'token ****'"
