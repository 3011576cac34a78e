"""Where a queued job goes next (placement) and handing an attempt to a node (dispatch)."""
