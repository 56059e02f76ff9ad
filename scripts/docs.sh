#!/usr/bin/env bash
# Builds the documentation site (mkdocs.yml: docs/ and every folder README) and fails on any
# broken link or #anchor in the repository's markdown.
#   bash scripts/docs.sh              check the repository; the site is left in build/site
#   bash scripts/docs.sh --self-test  check the checker: fixtures with a broken link, a broken
#                                     anchor and a link to a missing extension-less file must
#                                     fail, the intact fixture (GitHub-style anchors) must pass
# Needs Debian's mkdocs, python3-pymdownx and linkchecker (scripts/setup.sh installs them).
# Environment: DOCS_SITE_DIR (where the built site is copied, default build/site; empty: not kept).
#
# How. The markdown links across the whole repository (README.md → docs/, folder READMEs,
# source files; docs/*.md → ../planner/src/...), and MkDocs only resolves links inside its
# docs_dir, which may not be the folder that holds mkdocs.yml. So the files git knows about
# (tracked, plus untracked ones that .gitignore does not ignore, so a new page is checked before
# it is committed) are copied into build/docs-src, mkdocs.yml's docs_dir: every *.md there is a
# page and every other file a static file, exactly the set a link on GitHub can reach. Generated
# records (calibration/profiles/measured/**/*.md) are pages too: they are linked from their
# README and are checked like the rest. Then two real tools check it:
#   1. `mkdocs build --strict` fails on a link to a file that is not there (MkDocs checks every
#      relative link whose last part has a dot, e.g. planner.md, x.cc, CMakeLists.txt).
#   2. LinkChecker (with its AnchorCheck plugin) crawls the built HTML from every page and fails
#      on any link whose target is missing (including extension-less ones MkDocs skips, e.g.
#      scripts/testbed/) and on any #anchor that is not an id on the target page. Headings get
#      GitHub's ids (mkdocs.yml: pymdownx.slugs, lower case), so an anchor that resolves here
#      resolves on GitHub. (One difference remains: a repeated heading is heading_1 here and
#      heading-1 on GitHub; link to unique headings.) External (http) links are not checked:
#      the build has no network.
# What MkDocs cannot carry: files whose name starts with a dot (.clang-format, .ci/run) are not
# part of a site, so write them as `code`, not links. Mermaid fences stay as text (no renderer:
# it would come from a CDN), which is also what keeps them from being parsed as links.
# LinkChecker drops root privileges to `nobody`, so the site is built into a world-readable
# temporary folder and copied to DOCS_SITE_DIR afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
umask 022

need=()
command -v mkdocs >/dev/null || need+=(mkdocs)
/usr/bin/python3 -c 'import pymdownx' 2>/dev/null || need+=(python3-pymdownx)
command -v linkchecker >/dev/null || need+=(linkchecker)
if ((${#need[@]})); then
  echo "docs.sh: missing Debian packages: ${need[*]} (bash scripts/setup.sh installs them)" >&2
  exit 2
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
chmod 755 "$TMP"

# check_tree SOURCE_ROOT STAGE_DIR CONFIG SITE_DIR LABEL: stage SOURCE_ROOT's files into
# STAGE_DIR (CONFIG's docs_dir), build strictly into SITE_DIR, crawl it. Prints what broke and
# returns non-zero when anything did.
check_tree() {
  local src="$1" stage="$2" config="$3" site="$4" label="$5"
  rm -rf "$stage" "$site"
  mkdir -p "$stage"
  # Tracked files still present in the work tree, and untracked ones not ignored. Outside a git
  # work tree (an exported tarball; or git refusing a checkout owned by another user) every file
  # but build*/ and .git/ instead, which is a superset: a link cannot pass there and fail here.
  local list
  if list="$(git -C "$src" ls-files -z --cached --others --exclude-standard 2>/dev/null | tr '\0' '\n')"; then
    :
  else
    echo "docs.sh: $label: $src is not a git work tree git will read; staging every file but build*/" >&2
    list="$(cd "$src" && find . -path ./.git -prune -o -path './build*' -prune -o -type f -print | sed 's|^\./||')"
  fi
  printf '%s\n' "$list" |
    (cd "$src" && while IFS= read -r f; do [[ -n $f && -f $f ]] && printf '%s\0' "$f"; done) |
    (cd "$src" && xargs -0 -r cp --parents -t "$stage")

  # A strict build that aborts on warnings has still written the site: crawl it anyway, so one
  # run reports the broken anchors next to the broken files.
  local log="$TMP/$label.mkdocs.log" failed=0
  if ! mkdocs build --strict -f "$config" -d "$site" >"$log" 2>&1; then
    echo "docs.sh: $label: MkDocs strict build failed (a link to a file that does not exist):" >&2
    grep -E 'WARNING|ERROR|Error|Aborted' "$log" | sed 's/\x1b\[[0-9;]*m//g' >&2 || cat "$log" >&2
    failed=1
    [[ -f $site/index.html ]] || return 1
  fi

  # Every page MkDocs made from a markdown file is a start URL, so a page no other page links
  # to is checked too. Warnings (a missing anchor is one) count as failures.
  local rc="$TMP/$label.linkcheckerrc" out="$TMP/$label.linkchecker.log"
  printf '[filtering]\ncheckextern=0\n[AnchorCheck]\n' >"$rc"
  local pages=()
  while IFS= read -r -d '' md; do
    local html="${md%.md}.html"
    [[ $(basename "$md") == README.md ]] && html="$(dirname "$md")/index.html"
    pages+=("$site/${html#./}")
  done < <(cd "$stage" && find . -name '*.md' -print0 | sort -z)
  if ! linkchecker -f "$rc" --no-status --no-robots -o text "${pages[@]}" >"$out" 2>&1; then
    echo "docs.sh: $label: broken links or anchors (LinkChecker; page X.html is X.md, a folder's" >&2
    echo "index.html its README.md, 'line' is the HTML line; a missing anchor is a Warning, and" >&2
    echo "every warning fails):" >&2
    # The findings only: LinkChecker's per-URL blocks that carry a Warning or an Error.
    sed -e "s|file://$site/||g" "$out" |
      awk '/^URL /{blk=$0; keep=0; next} blk!=""{blk=blk "\n" $0; if ($1=="Warning" || $0 ~ /^Result +Error/) keep=1}
           /^$/{if (keep) print blk "\n"; blk=""; keep=0}
           /found\.$|^That.s it/{print}' >&2
    return 1
  fi
  ((failed == 0)) || return 1
  echo "docs.sh: $label: ok ($(grep -o '[0-9]* links in [0-9]* URLs checked' "$out" || echo checked))"
}

self_test() {
  local fx="$TMP/fixture" failures=0
  # The intact fixture: cross-folder links, a source file, an extension-less folder link, GitHub
  # anchors (inline code, punctuation, a colon) across pages and within one, a mermaid fence.
  write_fixture() {
    rm -rf "$fx"
    mkdir -p "$fx/docs" "$fx/src/sub"
    git -C "$fx" init -q
    cat >"$fx/README.md" <<'EOF'
# Fixture

See [the page](docs/page.md), its [section](docs/page.md#a-heading-with-code-and-punctuation),
the [source](src/x.cc), the [folder](src/sub/) and [below](#the-end); GitHub keeps both
dashes around a dropped slash (Python-Markdown's own slugify would not):
[S1 / S2](docs/page.md#s1--s2-side-by-side).

```mermaid
flowchart LR
  a["[x](nowhere.md)"] --> b
```

## The end
EOF
    cat >"$fx/docs/page.md" <<'EOF'
# Page

## A heading: with `code`, and punctuation!

## S1 / S2 side by side

Back to the [README](../README.md#fixture) and [up](#page).
EOF
    echo '// x' >"$fx/src/x.cc"
    echo 'y' >"$fx/src/sub/y.txt"
    printf 'INHERIT: %s\ndocs_dir: src-staged\nnav:\n  - README.md\n  - docs/page.md\n' \
      "$ROOT/mkdocs.yml" >"$fx-mkdocs.yml"
  }
  # expect NAME pass|fail [WHAT]: run the checker over the fixture as it stands now; a failure
  # must name WHAT (the broken target), so it fails for the reason the case is about.
  expect() {
    local name="$1" want="$2" what="${3:-}" got
    if check_tree "$fx" "$TMP/src-staged" "$fx-mkdocs.yml" "$TMP/site-$name" "self-test-$name" \
      >"$TMP/$name.out" 2>&1; then got=pass; else got=fail; fi
    if [[ $got == fail && -n $what ]] && ! grep -qF -- "$what" "$TMP/$name.out"; then
      got="fail without naming '$what'"
    fi
    if [[ $got == "$want" ]]; then
      echo "docs.sh: self-test: $name: ${want}ed as it should"
    else
      echo "docs.sh: self-test: $name: expected $want, got $got:" >&2
      cat "$TMP/$name.out" >&2
      failures=$((failures + 1))
    fi
  }
  write_fixture
  expect intact pass
  write_fixture
  sed -i 's|(docs/page.md)|(docs/missing.md)|' "$fx/README.md"
  expect broken-file-link fail docs/missing.md
  write_fixture
  sed -i 's|page.md#a-heading-with-code-and-punctuation|page.md#no-such-heading|' "$fx/README.md"
  expect broken-anchor fail no-such-heading
  write_fixture
  sed -i 's|(#the-end)|(#the-start)|' "$fx/README.md"
  expect broken-same-page-anchor fail the-start
  write_fixture
  sed -i 's|(src/sub/)|(src/nosuch/)|' "$fx/README.md"
  expect broken-folder-link fail src/nosuch
  # Only the last of several anchors into one page is broken (LinkChecker must not stop at the
  # page's first, valid anchor).
  write_fixture
  sed -i 's|(../README.md#fixture)|(../README.md#fixture), [again](../README.md#the-end) and [not](../README.md#nope)|' \
    "$fx/docs/page.md"
  expect second-anchor-into-a-page fail nope
  if ((failures)); then
    echo "docs.sh: self-test: $failures case(s) wrong" >&2
    return 1
  fi
  echo "docs.sh: self-test: ok"
}

case "${1:-}" in
  --self-test)
    self_test
    ;;
  "")
    if ! check_tree "$ROOT" "$ROOT/build/docs-src" "$ROOT/mkdocs.yml" "$TMP/site" docs; then
      echo "docs.sh: FAILED: fix the links above (docs/conventions.md#documentation)" >&2
      exit 1
    fi
    site_out="${DOCS_SITE_DIR-build/site}"
    if [[ -n $site_out ]]; then
      rm -rf "$site_out"
      mkdir -p "$(dirname "$site_out")"
      cp -r "$TMP/site" "$site_out"
      echo "docs.sh: site in $site_out/index.html"
    fi
    ;;
  *)
    echo "usage: bash scripts/docs.sh [--self-test]" >&2
    exit 2
    ;;
esac
