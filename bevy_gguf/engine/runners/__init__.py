"""The runners a scheduler drives: batched (one context), contexts (one per request), layers (lanes)."""
