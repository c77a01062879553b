# countersink: one image for every process (consume, gc, serve, schema, get/explain/list).
#   docker build -t countersink .
#   docker run --rm countersink --help
# Settings come from COUNTERSINK_* environment variables (see docs/); nothing secret is baked in.
# The Python minor version is the one CI tests (pyproject.toml's mypy python_version); every dependency is
# installed at the version constraints.txt pins, the file `make venv` and so CI install from too.

ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
WORKDIR /src
# Wheels of every dependency first, so that a source change does not rebuild them.
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY schemas schemas
COPY countersink countersink
COPY consumer consumer
COPY gc_worker gc_worker
RUN pip wheel --no-cache-dir --wheel-dir /wheels -c constraints.txt .

FROM python:${PYTHON_VERSION}-slim-bookworm
RUN useradd --system --uid 10001 --user-group --home-dir /app --shell /usr/sbin/nologin countersink
COPY --from=build /wheels /wheels
COPY --from=build /src/constraints.txt /tmp/constraints.txt
RUN pip install --no-cache-dir --no-index --find-links /wheels -c /tmp/constraints.txt countersink \
    && rm -rf /wheels /tmp/constraints.txt
WORKDIR /app
USER 10001:10001
ENV PYTHONUNBUFFERED=1 COUNTERSINK_LOG_FORMAT=json
# Probes and Prometheus reach a container from outside it: its health servers listen on every interface here
# (outside the image they listen on 127.0.0.1 unless told otherwise).
ENV COUNTERSINK_CONSUMER__HEALTH_HOST=0.0.0.0 COUNTERSINK_GC__HEALTH_HOST=0.0.0.0
# consumer health/metrics, GC loop health/metrics, read API
EXPOSE 8080 8081 8082
ENTRYPOINT ["countersink"]
CMD ["--help"]
