"""What a crawl did: the periodic log line and the end-of-crawl report."""
