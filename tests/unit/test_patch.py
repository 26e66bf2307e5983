"""The anchor-checked patcher against a real file on a local host."""

import pytest

from thermab.config import HostSpec
from thermab.experiment.patch import Patcher, PatchError, patch_problems, render, sha256
from thermab.hosts.host import Host

SETTING = {
    "file": "/usr/lib/vllm/shm_broadcast.py",
    "anchor": r"busy_loop_s: float = [0-9.eE+-]+",
    "replacement": "busy_loop_s: float = {value}",
}
STOCK = (
    "class SpinCondition:\n    def __init__(\n        self,\n        busy_loop_s: float = 1,\n    ):\n        pass\n"
)


@pytest.fixture
def node(tmp_path):
    root = tmp_path / "node"
    target = root / "usr/lib/vllm/shm_broadcast.py"
    target.parent.mkdir(parents=True)
    target.write_text(STOCK)
    host = Host(HostSpec("head", "test", "local", {}, root))
    return host, target, Patcher(host, SETTING, tmp_path / "state")


def test_render_replaces_the_single_match():
    assert "busy_loop_s: float = 0.002," in render(STOCK, SETTING["anchor"], SETTING["replacement"], "0.002")


@pytest.mark.parametrize("text, count", [(STOCK.replace("busy_loop_s", "spin"), 0), (STOCK + STOCK, 2)])
def test_render_refuses_unless_exactly_one_match(text, count):
    with pytest.raises(PatchError, match=f"matches {count} times"):
        render(text, SETTING["anchor"], SETTING["replacement"], "0.002")


def test_apply_then_restore_is_byte_identical(node):
    host, target, patcher = node
    done = patcher.apply("0.002")
    assert "busy_loop_s: float = 0.002," in target.read_text()
    assert done["original_sha256"] == sha256(STOCK.encode()) and done["changed"]
    assert patcher.is_patched
    patcher.apply("0.1")  # the next arm is rendered from the original, not the patched file
    assert target.read_text().count("busy_loop_s: float = 0.1,") == 1
    assert patcher.apply("0.1")["changed"] is False
    assert patcher.restore()["sha256"] == sha256(STOCK.encode())
    assert target.read_text() == STOCK and not patcher.is_patched
    assert patcher.restore() is None


def test_missing_anchor_writes_nothing(node):
    host, target, patcher = node
    target.write_text(STOCK.replace("busy_loop_s", "spin_s"))
    with pytest.raises(PatchError, match="host head.*matches 0 times"):
        patcher.apply("0.002")
    assert target.read_text() == STOCK.replace("busy_loop_s", "spin_s")
    assert not patcher.is_patched


def test_missing_file_names_the_host(node):
    host, target, patcher = node
    target.unlink()
    with pytest.raises(Exception, match="host head"):
        patcher.apply("0.002")


def test_vllm_placeholder_is_resolved_by_the_hosts_python(tmp_path, monkeypatch):
    package = tmp_path / "site/vllm"
    (package / "distributed").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "distributed/shm_broadcast.py").write_text(STOCK)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    import sys

    host = Host(HostSpec("box", "test", "local", {"python": sys.executable}))
    setting = dict(SETTING, file="{vllm}/distributed/shm_broadcast.py")
    patcher = Patcher(host, setting, tmp_path / "state")
    assert patcher.file == str(package / "distributed/shm_broadcast.py")
    patcher.apply("0.002")
    monkeypatch.delenv("PYTHONPATH")  # restoring must not need the package to import
    assert Patcher(host, setting, tmp_path / "state").restore()["file"] == patcher.file
    assert (package / "distributed/shm_broadcast.py").read_text() == STOCK


ARMS = {"A": "1", "B": "0.002"}


def test_patch_problems_pass_the_study_file():
    assert patch_problems(STOCK, SETTING, ARMS) == []


@pytest.mark.parametrize(
    "text, setting, arms, fragment",
    [
        (STOCK + STOCK, SETTING, ARMS, "matches 2 times"),
        (STOCK.replace("= 1,", "= 'one',"), dict(SETTING, anchor="busy_loop_s: float = [^,]+"), ARMS, "is a string"),
        (
            STOCK.replace("= 1,", "= ONE,"),
            dict(SETTING, anchor="busy_loop_s: float = [^,]+"),
            ARMS,
            "not a Python literal",
        ),
        (STOCK, dict(SETTING, anchor="busy_loop_s", replacement="busy_loop_s = {value}"), ARMS, "cannot be told"),
        # the patched file would hold the anchor twice: it could not be found again to restore
        (
            STOCK + "# busy_loop_s: float = 7\n",
            dict(
                SETTING,
                anchor=r"busy_loop_s: float = [0-9.]+(?=,)",
                replacement="busy_loop_s: float = {value},# busy_loop_s: float = 7",
            ),
            ARMS,
            "would match the anchor 2 times",
        ),
    ],
)
def test_patch_problems_name_what_would_go_wrong(text, setting, arms, fragment):
    assert any(fragment in problem for problem in patch_problems(text, setting, arms))


def test_expression_values_skip_the_literal_check():
    text = STOCK.replace("= 1,", "= ONE,")
    setting = dict(SETTING, anchor="busy_loop_s: float = [^,]+", value_type="expression")
    assert patch_problems(text, setting, {"A": "ONE", "B": "min(0.002, 1)"}) == []


def test_restoring_needs_no_setting_of_the_env_method(node, tmp_path):
    host, target, patcher = node
    patcher.apply("0.002")
    env_setting = {"name": "X", "method": "env", "env_var": "X"}
    assert Patcher(host, env_setting, tmp_path / "state").restore()["sha256"] == sha256(STOCK.encode())
    assert target.read_text() == STOCK
