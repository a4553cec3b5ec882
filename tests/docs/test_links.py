# SPDX-License-Identifier: MIT
"""README.md as a newcomer reads it in the checkout, and after following it.

- The project's address is one value, Homepage in pyproject.toml: every other
  URL there starts with it.
- Every link of README.md into the project is relative and names a file or
  folder that exists in the checkout (with an anchor: a heading of that
  Markdown file, or of README itself); no link points at the project's
  hosting site. Links outside the project stay absolute (https://).
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


def headings(text):
    return {slug(h) for h in re.findall(r'^#+ (.*)$', prose(text), re.M)}


def link_problems(text, root):
    """What is wrong with the links of README text, read from root: each a
    line; [] when every link into the project is relative and resolves."""
    problems = []
    host_and_owner = HOMEPAGE.rsplit('/', 1)[0]
    for target in links(text):
        if target.startswith(host_and_owner):
            problems.append(f'{target}: a link into the project must be relative (a path '
                            'in the checkout), not to its hosting site')
            continue
        if re.match(r'[a-z][a-z0-9+.-]*:', target):
            if not target.startswith(('https://', 'http://', 'mailto:')):
                problems.append(f'{target}: not https:, http: or mailto:')
            continue
        path, _, anchor = target.partition('#')
        if path.startswith('/') or '..' in pathlib.PurePosixPath(path).parts:
            problems.append(f'{target}: a path inside the checkout, from its root')
            continue
        if not path:  # an anchor of README itself
            if anchor not in headings(text):
                problems.append(f'{target}: README has no heading #{anchor}')
            continue
        file = root / path
        if not file.exists():
            problems.append(f'{target}: no {path} in the checkout')
        elif anchor and file.suffix == '.md' and anchor not in headings(file.read_text()):
            problems.append(f'{target}: {path} has no heading #{anchor}')
    return problems


def test_readme_links_are_relative_and_resolve():
    found = links(README)
    relative = [t for t in found if not re.match(r'[a-z][a-z0-9+.-]*:', t)]
    assert len(relative) >= 10, f'only {len(relative)} links into the project: {found}'
    problems = link_problems(README, ROOT)
    assert not problems, '\n'.join(problems)


@pytest.mark.parametrize('bad', [
    '[x](https://github.com/dormant-project/dormant/blob/main/docs/design.md)',
    '[x](docs/no-such-page.md)',
    '[x](docs/design.md#no-such-heading)',
    '[x](#no-such-heading)',
    '[x](/etc/passwd)',
    '[x](../outside.md)',
    '[x](ftp://example.com/file)',
])
def test_the_link_check_fails_on_a_bad_link(bad):
    """The check itself can fail: each kind of bad link is caught."""
    host_link = bad.replace('https://github.com/dormant-project/dormant', HOMEPAGE)
    assert link_problems(f'# Top\n\nSee {host_link}.\n', ROOT), bad


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


GPU_TESTS = 'meson test -C build --suite gpu'


@pytest.mark.parametrize('page', ['README.md', 'docs/pytorch.md', 'docs/testing.md'])
def test_one_command_runs_the_gpu_tests(page):
    """The pages that tell how to run the GPU tests tell the same command."""
    text = ' '.join((ROOT / page).read_text().split())
    assert f'`{GPU_TESTS}`' in text, f'{page} lacks `{GPU_TESTS}`'
