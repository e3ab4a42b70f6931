#!/bin/sh
# The project's test: exits 0 when greet.sh greets correctly.
here="$(dirname "$0")"
got="$(sh "$here/greet.sh" Smithers)"
want="Hello, Smithers!"
if [ "$got" = "$want" ]; then
  echo "ok: $got"
else
  echo "FAIL: expected '$want', got '$got'" >&2
  exit 1
fi
