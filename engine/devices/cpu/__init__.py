"""CPU device."""
