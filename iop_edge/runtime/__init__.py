"""The process shell that every long-running program of iop-edge shares.

``iop-edge serve`` uses it today, and the node agent is built on it: the signals remembered
from the first instant and the thin parent (:mod:`.signals`, :mod:`.parent`), systemd's
``sd_notify`` (:mod:`.systemd`), the listeners with their connection caps, evictions and
timeouts (:mod:`.listeners`, :mod:`.connection_guard`), the sockets passed in by systemd or a
predecessor (:mod:`.activation`), the logging set-up (:mod:`.logs`), the process's lifecycle
phase (:mod:`.lifecycle`) and the loop's clock (:mod:`.clock`).

Nothing here knows the edge's HTTP surfaces, admission or config refresh. This ``__init__``
imports nothing: :mod:`.signals` and :mod:`.parent` must load before anything slow.
"""
