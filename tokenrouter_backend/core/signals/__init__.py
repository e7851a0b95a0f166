"""What routing decisions read: the route gate, the learned router, token classes, prompt
segments and surprise, and each branch's cost curve."""
