"""Where the SGLang plugin leaves the token it makes up (no RADIXTOP_TOKEN set): a file only its
user can read, in a directory only its user can write, never a file someone else planted for it
(a file they can read, or a link to a file the server, often root, would overwrite)."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from radixtop.adapters.sglang import plugin

OTHER_UID = 65534  # nobody


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.delenv("RADIXTOP_TOKEN", raising=False)
    monkeypatch.delenv("RADIXTOP_TOKEN_FILE", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # $TMPDIR, as read at start
    (tmp_path / "tmp").mkdir()
    return tmp_path


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_token_goes_to_a_private_directory(env):
    (env / "run").mkdir(mode=0o700)
    token = plugin._token(30100)
    path = env / "run" / "radixtop" / "sglang-30100.token"
    assert path.read_text().strip() == token and len(token) >= 16
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert os.lstat(path).st_uid == os.geteuid()


def test_without_a_runtime_directory_it_is_a_private_one_under_tmp(env, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    token = plugin._token(30101)
    path = env / "tmp" / f"radixtop-{os.geteuid()}" / "sglang-30101.token"
    assert path.read_text().strip() == token and _mode(path.parent) == 0o700 and _mode(path) == 0o600


def test_a_planted_world_writable_file_is_refused(env, monkeypatch):
    planted = env / "tmp" / "radixtop-sglang-30102.token"
    planted.write_text("")
    os.chmod(planted, 0o666)
    os.chown(planted, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("RADIXTOP_TOKEN_FILE", str(planted))
    with pytest.raises(plugin.TokenFileError, match="owned by uid 65534"):
        plugin._token(30102)
    assert planted.read_text() == ""  # the token never went there


def test_a_planted_link_is_never_followed(env, monkeypatch):
    victim = env / "victim"
    victim.write_text("precious\n")
    link = env / "tmp" / "radixtop-sglang-30103.token"
    link.symlink_to(victim)
    monkeypatch.setenv("RADIXTOP_TOKEN_FILE", str(link))
    with pytest.raises(plugin.TokenFileError, match="link"):
        plugin._token(30103)
    assert victim.read_text() == "precious\n"
    # and a link planted in the default place
    monkeypatch.delenv("RADIXTOP_TOKEN_FILE")
    (env / "run").mkdir(mode=0o700)
    (env / "run" / "radixtop").symlink_to(env / "tmp")
    with pytest.raises(plugin.TokenFileError, match="link"):
        plugin._token(30103)


def test_a_directory_someone_else_owns_or_can_write_is_refused(env, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    theirs = env / "tmp" / f"radixtop-{os.geteuid()}"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(plugin.TokenFileError, match="owned by uid 65534"):
        plugin._token(30104)
    os.chown(theirs, os.geteuid(), os.getegid())
    os.chmod(theirs, 0o777)
    with pytest.raises(plugin.TokenFileError, match="others can write"):
        plugin._token(30104)
    assert not any(theirs.iterdir())


def test_its_own_file_from_a_run_before_is_replaced(env):
    (env / "run").mkdir(mode=0o700)
    first = plugin._token(30105)
    second = plugin._token(30105)
    path = env / "run" / "radixtop" / "sglang-30105.token"
    assert first != second and path.read_text().strip() == second and _mode(path) == 0o600


def test_a_refused_token_file_is_one_line_in_the_log_and_no_admin_api(env, monkeypatch, caplog):
    link = env / "tmp" / "planted.token"
    link.symlink_to(env / "victim")
    monkeypatch.setenv("RADIXTOP_TOKEN_FILE", str(link))

    class Scheduler:
        tp_rank = 0

    scheduler = Scheduler()
    plugin._after_init(None, scheduler)
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].exc_info is None and "RADIXTOP_TOKEN" in errors[0].getMessage()
    assert plugin.attached_to(scheduler) is None


def test_a_scheduler_never_runs_another_schedulers_attachment(monkeypatch):
    """What radixtop attached is kept on the scheduler itself: a new scheduler that reuses a gone
    one's id (here every object has the same id) never runs the old one's queue."""
    ran = []

    class Owner:
        def between_steps(self, **kwargs):
            ran.append(kwargs)

    class Scheduler:
        tree_cache = None

    old, new = Scheduler(), Scheduler()
    monkeypatch.setattr(plugin, "id", lambda obj: 1, raising=False)  # a reused id
    setattr(old, plugin.ATTACHED, plugin.Attached(None, Owner(), "", None, None))
    plugin._after_inputs(None, old)
    assert len(ran) == 1
    plugin._after_inputs(None, new)
    assert len(ran) == 1 and plugin.attached_to(new) is None
