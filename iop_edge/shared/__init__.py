"""Several edges, one pool: the shared store that holds the leases, memberships and rates of
every edge of a pool (Redis or Valkey), and its client (:mod:`.store`, scripts in
:mod:`.scripts`)."""
