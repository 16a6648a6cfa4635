# iop-edge in a container.
#   docker build -t iop-edge .
#   docker run -d --name iop-edge -p 8080:8080 -p 9464:9464 \
#     -v /etc/iop-edge:/etc/iop-edge:ro --env-file /etc/iop-edge/iop-edge.env iop-edge
# The config is read from /etc/iop-edge/edge.yaml (mount it; the image holds none). Inside a
# container its listeners must listen on 0.0.0.0 to be reachable through -p (docs/operations.md,
# "Running in a container"). `docker kill -s HUP iop-edge` refreshes it; `docker stop` drains;
# `docker exec iop-edge iop-edge restart` hands over to a new server without a gap.
# The same image runs a remote node (iop-node dials the edge and listens on nothing, so it has
# no health URL; the token file must be readable by uid 10001):
#   docker run -d --name iop-node --entrypoint iop-node --no-healthcheck \
#     -e IOP_NODE_EDGE=https://edge.example:7600 \
#     -v /etc/iop-node/token:/run/secrets/iop-node-token:ro iop-edge \
#     --token-file /run/secrets/iop-node-token --drain-timeout 30

# --- build: the production venv, as `make install` makes it (runtime dependencies only, at
# the versions of requirements.lock) -----------------------------------------------------------
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml requirements.lock README.md LICENSE ./
COPY iop_edge ./iop_edge
RUN python -m venv /opt/iop-edge \
    && /opt/iop-edge/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
        -c requirements.lock . \
    && /opt/iop-edge/bin/python -m pip uninstall --yes pip

# --- run ------------------------------------------------------------------------------------
FROM python:3.11-slim
COPY --from=build /opt/iop-edge /opt/iop-edge
COPY LICENSE README.md /opt/iop-edge/share/iop-edge/
# A user of its own (no login, no home); /run/iop-edge holds the console address record that
# `docker exec iop-edge iop-edge status` reads.
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin iop-edge \
    && install -d -o iop-edge -g iop-edge -m 0755 /run/iop-edge \
    && install -d -m 0755 /etc/iop-edge
ENV PATH=/opt/iop-edge/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    IOP_EDGE_CONFIG=/etc/iop-edge/edge.yaml \
    RUNTIME_DIRECTORY=/run/iop-edge
USER 10001:10001
# openai.listen and metrics.listen of a container config (the console stays on loopback:
# `docker exec` reaches it), and listen.address, the node listener remote nodes dial.
EXPOSE 8080 9464 7600
# `iop-edge serve` is PID 1 itself (exec form, no shell): the thin parent of the server
# (docs/operations.md, "The thin parent"). It handles SIGTERM (the server drains) and SIGHUP
# (a refresh) from its first instant and passes them on, reaps every orphan, stays across
# `iop-edge restart`, and exits with the server's status. Give `docker stop` more than
# --drain-timeout (-t 45).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ.get('IOP_EDGE_HEALTH_URL', 'http://127.0.0.1:8080/readyz'), timeout=4)"]
ENTRYPOINT ["iop-edge", "serve"]
CMD ["--config", "/etc/iop-edge/edge.yaml", "--drain-timeout", "30"]
