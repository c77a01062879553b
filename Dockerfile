# countersink: one image for every process (consume, gc, serve, schema, get/explain/list).
#   docker build -t countersink .
#   docker run --rm countersink --help
# Settings come from COUNTERSINK_* environment variables (see docs/); nothing secret is baked in.
# The Python minor version is the one CI tests (pyproject.toml's mypy python_version); every dependency is
# installed at the version constraints.txt pins, the file `make venv` and so CI install from too.

# The base image is pinned to a patch release: a rebuild gets the same interpreter until this line changes.
ARG PYTHON_VERSION=3.11.14
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
WORKDIR /src
# Wheels of every dependency first, from the two files that name them and nothing else, so that a source change
# (or a README edit) reuses this layer: only pyproject.toml or constraints.txt rebuild it.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
        > requirements.txt \
    && pip wheel --no-cache-dir --wheel-dir /wheels -c constraints.txt -r requirements.txt
# Then countersink's own wheel, from the source, without its dependencies (they are built above).
COPY README.md LICENSE ./
COPY schemas schemas
COPY countersink countersink
COPY consumer consumer
COPY gc_worker gc_worker
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

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
