# SPDX-License-Identifier: MIT
"""README.md as it reads off-site (PyPI shows it as the long description) and
as a newcomer leaves the checkout after following it.

- The project's address is one value, Homepage in pyproject.toml: every other
  URL there and every link to the project in README.md starts with it.
- Every link of README.md is absolute, and one into the repository names a
  file or folder that exists (an anchor of README itself, a heading of it).
- No prose line of README.md is there twice (a pasted paragraph).
- What the README's install commands make in the checkout is ignored by git.

Run by meson (suite docs) with SOURCE_ROOT in the environment."""
import os
import pathlib
import re
import shutil
import subprocess

import pytest

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

ROOT = pathlib.Path(os.environ.get('SOURCE_ROOT', pathlib.Path(__file__).parents[2]))
README = (ROOT / 'README.md').read_text()


def pyproject_urls():
    text = (ROOT / 'pyproject.toml').read_text()
    if tomllib:
        return tomllib.loads(text)['project']['urls']
    section = text.split('[project.urls]', 1)[1].split('\n[', 1)[0]
    return dict(re.findall(r'^(\w+)\s*=\s*"([^"]+)"', section, re.M))


HOMEPAGE = pyproject_urls()['Homepage'].rstrip('/')


def prose(text):
    """README without its code blocks."""
    return re.sub(r'```.*?```', '', text, flags=re.S)


def links(text):
    return re.findall(r'\]\(([^)\s]+)\)', prose(text))


def slug(heading):
    s = re.sub(r'[^\w\- ]', '', heading.strip().lower())
    return s.replace(' ', '-')


def test_project_urls_share_the_homepage():
    assert re.fullmatch(r'https://[\w.-]+/[\w.-]+/[\w.-]+', HOMEPAGE), HOMEPAGE
    for name, url in pyproject_urls().items():
        assert url == HOMEPAGE or url.startswith(HOMEPAGE + '/'), (name, url)


def test_readme_links_are_absolute():
    found = links(README)
    assert found, 'no links found in README.md'
    relative = [t for t in found if not t.startswith(('https://', 'http://'))]
    assert not relative, f'relative links break off-site (PyPI): {relative}'


def test_readme_links_into_the_project_resolve():
    headings = {slug(h) for h in re.findall(r'^#+ (.*)$', prose(README), re.M)}
    host_and_owner = HOMEPAGE.rsplit('/', 1)[0]
    checked = 0
    for target in links(README):
        if not target.startswith(host_and_owner + '/'):
            continue
        assert target == HOMEPAGE or target.startswith((HOMEPAGE + '/', HOMEPAGE + '#')), \
            f'{target} is not under the Homepage {HOMEPAGE} (pyproject.toml)'
        rest = target[len(HOMEPAGE):]
        if rest.startswith('#'):
            assert rest[1:] in headings, f'{target}: README has no heading #{rest[1:]}'
        else:
            m = re.fullmatch(r'/(blob|tree)/main/([^#]+)(#.*)?', rest)
            assert m, f'{target}: not /blob/main/PATH or /tree/main/PATH'
            path = ROOT / m.group(2)
            assert path.exists(), f'{target}: no {m.group(2)} in the repository'
            assert (m.group(1) == 'tree') == path.is_dir(), f'{target}: blob/tree mismatch'
        checked += 1
    assert checked >= 10, f'only {checked} links into the project checked'


def test_no_pasted_paragraph():
    seen = {}
    for number, line in enumerate(prose(README).splitlines(), 1):
        line = line.strip()
        if len(line) < 40 or line.startswith('|'):
            continue
        assert line not in seen, f'README.md lines {seen[line]} and {number} are the same: {line}'
        seen[line] = number


@pytest.mark.parametrize('path', ['.venv/bin/python', 'dist/dormant-0.1.0-py3-none-any.whl',
                                  'build-install/hello'])
def test_what_the_install_commands_make_is_ignored(path):
    top = path.split('/')[0]
    install = README[README.index('## Install'):]
    assert re.search(rf'(^|[\s"/]){re.escape(top)}/', install), \
        f'README no longer makes {top}/ (update this list)'
    if shutil.which('git') is None or not (ROOT / '.git').exists():
        pytest.skip('not a git checkout')
    p = subprocess.run(['git', 'check-ignore', '-q', path], cwd=ROOT)
    assert p.returncode == 0, f'{path} (made by README\'s Install) is not ignored by git'
