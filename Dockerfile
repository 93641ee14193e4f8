# Memci proxy image.
#   docker build -t memci-proxy .
#   docker run -p 8080:8080 -e MEMCI_UPSTREAM_URL=http://host.docker.internal:30000/v1 memci-proxy
# Without DATABASE_URL / REDIS_URL the proxy runs its embedded PostgreSQL and in-process hot state under
# MEMCI_HOME (/data, a volume). compose.yaml wires PostgreSQL, Redis, SGLang, Prometheus and Grafana.

# Build stage: the wheel (it carries the migrations, config/default.toml and the Grafana dashboard as package
# data, see memci_proxy/package_data.py), installed with its dependencies into a virtualenv the runtime stage copies.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md alembic.ini ./
COPY memci_proxy ./memci_proxy
COPY migrations ./migrations
COPY config ./config
RUN pip wheel --no-deps --wheel-dir /dist . \
 && python -m venv /opt/memci \
 && /opt/memci/bin/pip install /dist/memci_proxy-*.whl

# Runtime stage: no source tree, no build tools; a non-root user owns only its data volume.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/memci/bin:$PATH \
    MEMCI_HOME=/data
RUN useradd --system --uid 10001 --user-group --home-dir /data --no-create-home memci \
 && mkdir -p /data \
 && chown memci:memci /data
COPY --from=build /opt/memci /opt/memci
# The installed wheel, not a checkout, must find its migrations and default config.
RUN python -c "from memci_proxy import package_data as p; import memci_proxy.cli, memci_proxy.settings; assert not p.is_checkout() and p.path('migrations').is_dir() and p.path('config/default.toml').is_file()"
USER memci
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["memci-proxy"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
