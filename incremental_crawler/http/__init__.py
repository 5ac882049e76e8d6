"""Pure HTTP rules: ETag and HTTP-date parsing and comparison (RFC 9110).

No Scrapy here: small functions over strings and bytes, doctested in place.
"""
