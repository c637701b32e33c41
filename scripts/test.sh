#!/usr/bin/env bash
# The whole test suite, with a per-phase time summary. Used by `make test` and `.ci/run`;
# arguments go to pytest (make test PYTEST_ARGS="tests/unit -x").
# Tools run as "$PYTHON" -m <tool>: console scripts need not be on PATH (see the Makefile).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
# Python caches each module's bytecode unless PYTHONDONTWRITEBYTECODE is set (some CI shells
# set it). The suite starts hundreds of Python processes (drivers, Python workers, the kit's
# dying processes, fresh virtual environments' demos): with the variable set each compiles
# every module it imports again (measured: 79 against 56 CPU s for one demo on a release's
# virtual environment), so the suite lets Python keep its caches.
unset PYTHONDONTWRITEBYTECODE
declare -a PHASES=()
phase() {
  local name="$1"; shift
  local start=$SECONDS
  echo "=== phase: $name"
  "$@"
  PHASES+=("$(printf '%-26s %5ss' "$name" "$((SECONDS - start))")")
}
summary() {
  echo "=== time per phase"
  for line in "${PHASES[@]}"; do echo "  $line"; done
}
ENGINE_PID=""
ENGINE_RUN=""
finish() {
  summary
  if [ -n "$ENGINE_PID" ]; then
    kill "$ENGINE_PID" 2>/dev/null || true
    wait "$ENGINE_PID" 2>/dev/null || true
    rm -rf "$ENGINE_RUN" 2>/dev/null || true
  fi
}
trap finish EXIT

# A Docker engine for the integration servers' containers (integration.harness.containers):
# the one DOCKER_HOST names or the default socket, else one started here (as root, where
# Debian's docker.io is installed) and stopped when the run ends, its images and layers kept
# in the harness cache. EPOCHAL_USE_CONTAINERS=0: none, the servers are local processes.
container_engine() {
  if [ "${EPOCHAL_USE_CONTAINERS:-}" = 0 ]; then echo "containers off (EPOCHAL_USE_CONTAINERS=0)"; return; fi
  if docker info >/dev/null 2>&1; then echo "Docker engine at ${DOCKER_HOST:-the default socket}"; return; fi
  if ! command -v dockerd >/dev/null 2>&1 || [ "$(id -u)" -ne 0 ]; then
    echo "no Docker engine here (apt-get install docker.io, as root): the servers run as local processes"
    return
  fi
  local cache run
  cache="$("$PYTHON" -c 'from integration.harness.cache import cache_dir; print(cache_dir())')"
  run="$(mktemp -d /tmp/epochal-dockerd-XXXXXX)"
  dockerd --data-root "$cache/docker" --exec-root "$run/exec" --pidfile "$run/dockerd.pid" \
    -H "unix://$run/docker.sock" >"$run/dockerd.log" 2>&1 &
  ENGINE_PID=$!
  ENGINE_RUN="$run"
  export DOCKER_HOST="unix://$run/docker.sock"
  for _ in $(seq 1 150); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  if ! docker info >/dev/null 2>&1; then
    echo "dockerd did not answer; its log:"; tail -20 "$run/dockerd.log"; exit 1
  fi
  echo "Docker engine $(docker info --format '{{.ServerVersion}}') started at $DOCKER_HOST"
}

phase "python packages" "$PYTHON" scripts/install.py
# the interpreter that has the packages: $PYTHON, or .venv for an externally managed Python
PYTHON="$("$PYTHON" scripts/install.py --python)"
export PYTHON
phase "integration prerequisites" bash .ci/install-integration
# faster driver starts (a JVM class-data archive; made once per machine, then kept)
phase "driver class data" bash -c '"$0" -m epochal prepare || echo "(drivers start without it)"' "$PYTHON"
phase "container engine" container_engine
phase "container images" "$PYTHON" -m integration.harness images
phase "lint (ruff)" "$PYTHON" -m ruff check .
phase "type check (mypy)" "$PYTHON" -m mypy
# Two workers (pytest-xdist): a unit of work is a module, or one crash test of the kit, handed
# out longest first (the root conftest.py; --no-loadscope-reorder keeps that order: xdist would
# otherwise put the modules with the most tests first); EPOCHAL_TEST_WORKERS=1 runs it serially.
# integration.harness.timing prints where the slowest tests spend their time.
workers="${EPOCHAL_TEST_WORKERS:-2}"
# Every JVM that a test starts through spark-submit (its own SparkSession, a benchmark's smoke
# run, spark-pipelines, a YARN submission's client) lives for minutes: the short-lived JVM
# settings, as the harness gives its daemons and the kit its drivers (docs/contributing/testing.md)
short_lived="$("$PYTHON" -c 'from epochal.startup.classdata import SHORT_LIVED_JVM_OPTIONS as o; print(o)')"
export SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:+$SPARK_SUBMIT_OPTS }$short_lived"
parallel=()
if [ "$workers" -gt 1 ]; then parallel=(-n "$workers" --dist loadgroup --no-loadscope-reorder); fi
phase "tests (pytest)" "$PYTHON" -m pytest -p no:cacheprovider -p integration.harness.timing \
  "${parallel[@]}" "$@"
