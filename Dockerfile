# countersink: one image for every process (consume, gc, serve, schema, get/explain/list).
#   docker build -t countersink .
#   docker run --rm countersink --help
# Settings come from COUNTERSINK_* environment variables (see the README); nothing secret is baked in.

FROM python:3.12-slim AS build
WORKDIR /src
# Wheels of every dependency first, so that a source change does not rebuild them.
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY countersink countersink
COPY consumer consumer
COPY gc_worker gc_worker
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.12-slim
RUN useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin countersink
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels countersink && rm -rf /wheels
WORKDIR /app
USER 10001
ENV PYTHONUNBUFFERED=1 COUNTERSINK_LOG_FORMAT=json
# consumer health/metrics, GC loop health/metrics, read API
EXPOSE 8080 8081 8082
ENTRYPOINT ["countersink"]
CMD ["--help"]
