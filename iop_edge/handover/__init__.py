"""The zero-downtime handover (``iop-edge restart``, ``SIGUSR2``): one home for the whole job.

- :mod:`~iop_edge.handover.channel`: the wire between the old and the new process — the
  socketpair channel, the leases old still holds and releases (:class:`Successor`, old's view;
  :class:`Predecessor`, new's), what new shows of it (:class:`HandoverStatistics`) and what old
  finished after it (:class:`DrainTally`).
- :mod:`~iop_edge.handover.relay`: the requests old can no longer serve (queued when it handed
  over, or arriving on a kept-alive connection) relayed to new with their age; the state the
  OpenAI surface reads while it hands over and drains.
- :mod:`~iop_edge.handover.coordinator`: the steps on either side — restart (start new, wait
  for it, hand the leases over, drain), the take-over by a new process, a stop that cancels a
  handover, the drain of a listener — each restart ending in a typed :data:`RestartResult`.

Nothing here imports the HTTP surface (``api/``): the server is given the relay, the admin API
the coordinator's methods.
"""
