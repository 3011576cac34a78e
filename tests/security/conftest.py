"""Attacks on trainhub's trust boundaries (docs/SECURITY.md): each test tries to cross one
boundary through the real path and asserts that it is refused and that nothing stored changed."""
