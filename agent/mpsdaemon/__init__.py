"""The node's MPS control daemon: adopt it, apply and read back its defaults, prepare compute modes, give each
pod its pipe directory, and end a stopping container's clients through it."""
