"""Every relative link of the README and docs/ reaches a file, and a link to
a heading (`page.md#heading`) reaches a heading of that page (GitHub's anchors)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # not the code blocks
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_a_heading(page):
    for target in links(page):
        path, _, heading = target.partition("#")
        dest = page.parent / path if path else page
        assert dest.exists(), f"{target}: no such file"
        if heading and dest.suffix == ".md":
            anchors = {anchor(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), re.M)}
            assert heading in anchors, f"{target}: no such heading in {dest.name}"


def test_the_pages_have_links():
    assert len(PAGES) >= 10 and sum(len(links(p)) for p in PAGES) > 20
