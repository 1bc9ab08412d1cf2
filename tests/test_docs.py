"""The documentation's own checks: every relative link in the README, the changelog and the
pages under docs/ leads to a file of the repository, and the README stays short (it is the
front page and the package's long description; the details live in docs/)."""

import os
import re

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_BYTES = 24_000

# [text](target) and [text](target "title"); images too. Code spans are removed first.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")


def _docs():
    names = ["README.md", "CHANGELOG.md"]
    names += sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(TOP, "docs"))
                    if n.endswith(".md"))
    return [n for n in names if os.path.exists(os.path.join(TOP, n))]


def _anchors(path):
    """GitHub's anchors of a markdown file's headings."""
    text = _FENCE.sub("", open(path, encoding="utf-8").read())
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
        anchors.add(slug.replace(" ", "-"))
    return anchors


def _links(doc):
    text = open(os.path.join(TOP, doc), encoding="utf-8").read()
    text = _CODE.sub("", _FENCE.sub("", text))
    return _LINK.findall(text)


@pytest.mark.parametrize("doc", _docs())
def test_every_relative_link_resolves(doc):
    base = os.path.dirname(os.path.join(TOP, doc))
    broken = []
    for target in _links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, file:
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(base, path)) if path else os.path.join(TOP, doc)
        if not full.startswith(TOP + os.sep) or not os.path.exists(full):
            broken.append(target)
        elif anchor and full.endswith(".md") and anchor not in _anchors(full):
            broken.append(target)
    assert not broken, f"{doc}: links that lead nowhere: {broken}"


def test_the_docs_pages_exist_and_are_linked_from_the_readme():
    readme = open(os.path.join(TOP, "README.md"), encoding="utf-8").read()
    for doc in _docs():
        if doc.startswith("docs" + os.sep):
            assert f"({doc.replace(os.sep, '/')})" in readme, f"README.md does not link {doc}"


def test_the_readme_stays_short():
    size = os.path.getsize(os.path.join(TOP, "README.md"))
    assert size < README_MAX_BYTES, (
        f"README.md is {size} bytes (at most {README_MAX_BYTES}): move the details to docs/")


def test_the_readme_starts_with_the_two_commands():
    """CI runs the second command verbatim (.ci/run)."""
    text = open(os.path.join(TOP, "README.md"), encoding="utf-8").read()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[sim]' && "
            ".venv/bin/shm sim --nodes 1000 --json sim.json") in block
    assert ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && "
            ".venv/bin/python -m pytest") in block


_TOP_DIRS = ("shared_host_manager/", "compute_reporter/", "protocol/", "transport/", "simulator/",
             "shm_cli/", "tests/", "etc/", "docs/", ".ci/")


@pytest.mark.parametrize("doc", _docs())
def test_every_path_named_in_code_is_in_the_tree(doc):
    """`shared_host_manager/cache.py`, `tests/nova_functional/`... named in a page exist."""
    text = open(os.path.join(TOP, doc), encoding="utf-8").read()
    missing = []
    for span in re.findall(r"`([^`\n]+)`", text):
        for word in span.split():
            word = word.strip(",;:()'\"")
            if not word.startswith(_TOP_DIRS) or any(c in word for c in "{}*<>$"):
                continue
            path = word.split("::")[0]
            # design.md names tests relative to tests/ ("which tests (under `tests/`)")
            if not any(os.path.exists(os.path.join(TOP, d, path)) for d in ("", "tests")):
                missing.append(word)
    assert not missing, f"{doc}: paths not in the tree: {missing}"
