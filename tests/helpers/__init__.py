"""What the tests share: servers and keys (`servers`), memory and talent requests (`memory`,
`talents`), embedding checks (`embedding`), the cache congruence machinery
(`cache_congruence`) and the repository's paths (`paths`). Imported as `helpers.*`: pytest puts
tests/ on the path (the conftest.py there)."""
