"""``iop-node``: the node agent, built from the process shell (:mod:`iop_edge.runtime`), the
adapters and the node link alone — no admission, no HTTP surfaces, no config refresh, no
handover (design §3). :mod:`iop_edge.node.program` is its command line,
:mod:`iop_edge.node.agent` its life (dial, handshake, serve, drain),
:mod:`iop_edge.node.runner` the requests of one link, :mod:`iop_edge.node.generations` the
adapters of each payload generation and :mod:`iop_edge.node.backoff` the redial delays."""
