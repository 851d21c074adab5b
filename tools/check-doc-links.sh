#!/usr/bin/env bash
# Checks every relative link in README.md and docs/*.md: the target must exist inside the
# repository, and a #fragment must name a heading of the target (GitHub's anchor rule: lower
# case, punctuation other than '-' and '_' dropped, spaces to '-'). Fenced code blocks are
# skipped. Prints each broken link; exits 1 if there is one.
#   tools/check-doc-links.sh [REPO_ROOT]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
root=$(pwd -P)

# The lines of a markdown file outside fenced code blocks.
prose() {
  local fence=0 line
  while IFS= read -r line || [ -n "$line" ]; do
    if [[ $line =~ ^[[:space:]]*(\`\`\`|~~~) ]]; then fence=$((1 - fence)); continue; fi
    if [ "$fence" -eq 0 ]; then printf '%s\n' "$line"; fi
  done < "$1"
}

anchors() {
  prose "$1" | grep -E '^#{1,6} ' | sed -E 's/^#+ +//; s/[[:space:]]+$//' | tr 'A-Z' 'a-z' |
    sed -E 's/[^a-z0-9 _-]//g; s/ /-/g' || true
}

status=0
for file in README.md docs/*.md; do
  dir=$(dirname "$file")
  while IFS= read -r target; do
    target=${target%% *}  # drop an optional "title"
    case $target in http://* | https://* | mailto:*) continue ;; esac
    path=${target%%#*}
    frag=
    if [[ $target == *#* ]]; then frag=${target#*#}; fi
    resolved=$file
    if [ -n "$path" ]; then resolved=$dir/$path; fi
    full=$(realpath -m "$resolved")
    if [[ $full != "$root" && $full != "$root"/* ]]; then
      echo "$file: link leaves the repository: $target"
      status=1
    elif [ ! -e "$resolved" ]; then
      echo "$file: link to a missing file: $target"
      status=1
    elif [ -n "$frag" ] && [[ $resolved == *.md ]] && ! anchors "$resolved" | grep -qxF -- "$frag"; then
      echo "$file: no heading '#$frag' in $resolved"
      status=1
    fi
  done < <(prose "$file" | grep -oE '\]\([^)[:space:]]+( "[^"]*")?\)' | sed -E 's/^\]\(//; s/\)$//' || true)
done
exit "$status"
