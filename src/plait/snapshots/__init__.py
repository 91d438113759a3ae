"""Snapshots of captured programs for the fingerprint warm start (``options={"warm_start":
"fingerprint"}``), above the frontend and below the cache that stores them: the fingerprint of
code and values another process can compare without capturing (:mod:`.fingerprint`), the
functions a capture ran (:mod:`.deps`), and the captured program's saved form
(:mod:`.snapshot`). Nothing here runs on the default warm start, which captures."""
