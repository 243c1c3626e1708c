"""Planning on the box model: the fleet in virtual time, `sparkgate plan`, and its plots."""
