# Two entry points for a newcomer: `make demo` and `make test` (see README.md).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
DURATION ?= 60

.PHONY: demo test lint bench java servers prepare clean
DEBIAN_PACKAGES := postgresql postgresql-contrib mariadb-server sysbench

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: $(VENV)/bin/python pyproject.toml
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# Java for Spark, and javac: `cdcflow prepare` compiles the checkpoint file manager.
java:
	@if ! java -version >/dev/null 2>&1 || ! javac -version >/dev/null 2>&1; then \
		echo "Java or javac not found: installing a headless JDK for Spark"; \
		apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless >/dev/null; \
	fi
	@java -version 2>&1 | head -1

# The tests start real database servers themselves; this installs their Debian packages.
servers:
	@if ! ls /usr/lib/postgresql/*/bin/initdb /usr/sbin/mariadbd /usr/bin/sysbench \
			>/dev/null 2>&1; then \
		echo "installing $(DEBIAN_PACKAGES) for the tests' real servers"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			$(DEBIAN_PACKAGES) >/dev/null; \
	fi
	@ls -d /usr/lib/postgresql/*/bin | head -1

# The driver JVM's class archive (README "Faster Spark starts"); a no-op once it exists.
prepare: $(VENV)/.installed java
	$(VENV)/bin/cdcflow prepare || echo "warning: see above; Spark runs the slow way where a step failed"

demo: $(VENV)/.installed java
	$(VENV)/bin/cdcflow demo --duration $(DURATION)

lint: $(VENV)/.installed
	$(PY) -m ruff check src tests bench
	$(PY) -m mypy

# The tests start about a hundred short sessions: a JIT without its optimising tier costs
# them less CPU (README "Faster Spark starts").
test: $(VENV)/.installed java servers lint prepare
	CDCFLOW_DRIVER_JAVA_OPTIONS=-XX:TieredStopAtLevel=1 $(PY) -m pytest -q --durations=25

bench: $(VENV)/.installed
	for script in bench/bench_*.py; do $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) demo-output .pytest_cache .mypy_cache .ruff_cache
