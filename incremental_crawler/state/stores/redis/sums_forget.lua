
-- Takes pages about to be deleted out of their scope's sums and checks (a
-- repair). ARGV: the key prefix, the scope part, the host part, then either
-- 'fields', a bucket and the fields of its pages, or 'buckets' and bucket
-- numbers (every page of each).
local prefix, scope, part, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local z = sums_keys(prefix, scope)
local tag = '{' .. scope .. '|' .. part .. '}'
local function forget(field, raw)
  count_page(z, raw, false)
  redis.call('ZREM', z.checks, part .. '|' .. field)
end
if mode == 'fields' then
  local b = ARGV[5]
  for j = 6, #ARGV do
    local raw = redis.call('HGET', prefix .. ':pg:' .. tag .. ':' .. b, ARGV[j])
    if not raw then raw = redis.call('HGET', prefix .. ':pgl:' .. tag .. ':' .. b, ARGV[j]) end
    if raw then forget(ARGV[j], raw) end
  end
else
  for j = 5, #ARGV do
    local flat = bucket_pages(prefix, tag, ARGV[j])
    for k = 1, #flat, 2 do forget(flat[k], flat[k + 1]) end
  end
end
return 1
