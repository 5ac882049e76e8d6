"""Lists of pages with dates: sitemaps and feeds (pure parsing and checks)."""
