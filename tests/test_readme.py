"""README.md stays true and short: its commands match CI, and its links
lead into pages of the documentation site (tests/test_docs.py checks that
the site documents every knob, flag, public name and error)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    command = ci_lines[-1].strip()
    assert command in README, f"README must show the CI test command: {command}"


def test_readme_is_read_in_five_minutes():
    assert len(README.splitlines()) <= 250


def test_readme_links_lead_to_site_pages():
    nav = (ROOT / "mkdocs.yml").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert "docs/troubleshooting.md" in links and "docs/horovod.md" in links
    for link in links:
        assert (ROOT / link).is_file(), f"README links to missing {link}"
        if link.endswith(".md"):
            page = link[len("docs/"):]
            assert page in nav, f"{page} is linked from README but not in mkdocs.yml's nav"


def test_readme_says_how_to_serve_the_site():
    assert "mkdocs serve" in README
