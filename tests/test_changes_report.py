"""`nnmem-sweep report CONFIG --changes-since REV`: the report lists the max-batch cells that changed since CONFIG was
as committed at REV (fits -> does not fit first), names both sides by commit and sha256, says when nothing changed,
and refuses a bad REV in one line (exit 2) before running anything.

The scenario is FORMULAS.md's worked example 1 (as tests/test_diff.py): fp32, no overheads, no headroom, so
max batch = floor((C − W) / 4,000,000) with W = 8·P (sgd), 12·P (sgd-momentum), 16·P (adamw) bytes for P parameters.
"""
from __future__ import annotations

import hashlib
import html as htmlmod
import re
import shutil
import subprocess

import pytest

from nnmem_sweep.cli import main

from test_diff import BASE  # the worked example, 20,000,000 parameters

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
BIGGER = BASE.replace("params: 20000000", "params: 1820200000")


def _git(cwd, *args) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                          cwd=cwd, check=True, capture_output=True, text=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git repository with configs/s.yaml (BASE) committed; returns the config's path."""
    (tmp_path / "configs").mkdir()
    cfg = tmp_path / "configs" / "s.yaml"
    cfg.write_text(BASE)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "configs/s.yaml")
    _git(tmp_path, "commit", "-q", "-m", "base")
    return cfg


def _section(page: str) -> str:
    found = re.search(r'<section id="changes">.*?</section>', page, re.S)
    assert found, "no changes section"
    return found.group(0)


def _groups(section: str) -> list[tuple[str, list[tuple[str, ...]]]]:
    """(heading, rows of cell texts) for each table of changed cells, in page order."""
    out = []
    for title, body in re.findall(r"<h3>(.*?)</h3>\s*<table class=\"plain\">.*?<tbody>(.*?)</tbody>", section, re.S):
        rows = [tuple(htmlmod.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr))
                for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]
        out.append((htmlmod.unescape(title), rows))
    return out


def test_a_bigger_model_lists_the_cells_that_no_longer_fit_first(repo, tmp_path, capsys):
    head = _git(tmp_path, "rev-parse", "HEAD")
    repo.write_text(BIGGER)  # P 20,000,000 -> 1,820,200,000 parameters, not committed
    out = tmp_path / "out"
    assert main(["report", str(repo), "--changes-since", "HEAD", "--out", str(out), "-q"]) == 0
    page = (out / "report.html").read_text()
    assert (out / "report.pdf").read_bytes()[:5] == b"%PDF-"
    sec = _section(page)
    # Before (T4 C = 15,628,312,249, RTX 4090 C = 25,345,675,756, PyTorch-visible; W = 160e6 / 240e6 / 320e6):
    #   sgd T4 floor(15,468,312,249 / 4e6) = 3,867; 4090 6,296; sgd-momentum 3,847 / 6,276; adamw 3,827 / 6,256.
    # Now W = 14,561,600,000 (sgd), 21,842,400,000 (sgd-momentum), 29,123,200,000 (adamw):
    #   sgd T4 floor(1,066,712,249 / 4e6) = 266, 4090 floor(10,784,075,756 / 4e6) = 2,696;
    #   sgd-momentum T4 W > C: does not fit, 4090 floor(3,503,275,756 / 4e6) = 875; adamw W > C on both.
    # Order: fits -> does not fit, largest drop first (6,256, 3,847, 3,827), then decreases (5,401, 3,601, 3,600).
    assert _groups(sec) == [
        ("fits → does not fit (3)", [("adamw", "GeForce RTX 4090", "6,256", "–"),
                                     ("sgd-momentum", "Tesla T4", "3,847", "–"),
                                     ("adamw", "Tesla T4", "3,827", "–")]),
        ("decrease (3)", [("sgd-momentum", "GeForce RTX 4090", "6,276", "875"),
                          ("sgd", "Tesla T4", "3,867", "266"),
                          ("sgd", "GeForce RTX 4090", "6,296", "2,696")]),
    ]
    assert "<th>optimizer</th><th>GPU</th><th>max batch before</th><th>max batch now</th>" in sec
    assert sec.count('<tr class="nofit">') == 3
    assert "6 cell(s) of the max-batch tables changed: 3 fits → does not fit, 3 decrease." in sec
    # both sides named: the commit HEAD resolves to and the committed bytes' sha256; today's file, uncommitted
    assert f"HEAD: commit <code>{head}</code>, sha256 <code>{hashlib.sha256(BASE.encode()).hexdigest()}</code>" in sec
    assert (f"commit <code>{head}</code> (uncommitted changes), sha256 "
            f"<code>{hashlib.sha256(BIGGER.encode()).hexdigest()}</code>") in sec
    # placed after the decision page, before the max-batch tables
    assert page.index('id="decision"') < page.index('id="changes"') < page.index('id="max-batch"')


def _html(cfg, rev, out) -> str:
    """What `report CONFIG [--changes-since REV]` writes as report.html, without the PDF (library calls)."""
    from nnmem_sweep import diff as D
    from nnmem_sweep.config import load_scenario
    from nnmem_sweep.report import render_report
    from nnmem_sweep.runner import run_scenario

    res = run_scenario(load_scenario(cfg))
    changes = None if rev is None else D.changes_since(D.config_at_revision(cfg, rev), res.max_batch)
    render_report(res, out, cfg, pdf=False, validation=None, changes=changes)
    return (out / "report.html").read_text()


def test_unchanged_config_says_no_changes_and_without_the_flag_there_is_no_section(repo, tmp_path):
    sec = _section(_html(repo, "HEAD", tmp_path / "a"))
    assert "No changes: every cell of the max-batch tables is the same as at HEAD." in sec and "<tbody>" not in sec
    assert 'id="changes"' not in _html(repo, None, tmp_path / "b")


def test_revision_names_are_escaped(repo, tmp_path):
    tag = 'v<1>&"x"'
    _git(tmp_path, "tag", tag)
    repo.write_text(BASE.replace("headroom: 0", "headroom: 0.99"))
    sec = _section(_html(repo, tag, tmp_path / "out"))
    assert tag not in sec and "v&lt;1&gt;&amp;&#34;x&#34;" in sec
    # test_diff.py: headroom 0.99 changes 6 cells, 4 of which no longer fit
    assert [(title, len(rows)) for title, rows in _groups(sec)] == [("fits → does not fit (4)", 4), ("decrease (2)", 2)]


@pytest.mark.parametrize("rev,config,says", [
    ("no-such-rev", "configs/s.yaml", "--changes-since no-such-rev: not a commit of the git repository holding"),
    ("HEAD", "configs/new.yaml", "--changes-since HEAD: cannot read .*new.yaml at commit [0-9a-f]{12}: path"),
    ("--output=x", "configs/s.yaml", "--changes-since '--output=x': a revision cannot start with '-'"),
])
def test_bad_revision_is_one_line_exit_2_and_nothing_is_written(repo, tmp_path, capsys, rev, config, says):
    (tmp_path / "configs" / "new.yaml").write_text(BASE)  # exists now, never committed
    out = tmp_path / "out"
    assert main(["report", str(tmp_path / config), f"--changes-since={rev}", "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert re.search(says, err), err
    assert not out.exists()


def test_config_outside_git_is_one_line(tmp_path, capsys):
    if subprocess.run(["git", "rev-parse"], cwd=tmp_path, capture_output=True).returncode == 0:
        pytest.skip("the temporary folder lies inside a git repository")
    (tmp_path / "s.yaml").write_text(BASE)
    assert main(["report", str(tmp_path / "s.yaml"), "--changes-since", "HEAD", "--out", str(tmp_path / "o"),
                 "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"nnmem-sweep: --changes-since HEAD: {tmp_path / 's.yaml'} is not in a git repository"


def test_long_lists_are_cut_and_say_how_many_more(repo, tmp_path, monkeypatch):
    from nnmem_sweep.report import changes

    monkeypatch.setattr(changes, "MAX_ROWS", 2)
    repo.write_text(BIGGER)
    sec = _section(_html(repo, "HEAD", tmp_path / "out"))
    assert _groups(sec) == [("fits → does not fit (3)", [("adamw", "GeForce RTX 4090", "6,256", "–"),
                                                         ("sgd-momentum", "Tesla T4", "3,847", "–")])]
    assert "… and 1 more." in sec and "The first 2 are listed;" in sec
    assert "6 cell(s) of the max-batch tables changed: 3 fits → does not fit, 3 decrease." in sec
