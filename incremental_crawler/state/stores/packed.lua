
local PAGE_FIELDS = {FIELDS}
local PAGE_EPOCH = EPOCH_VALUE
-- Numbers kept when 0 (0 is a value of theirs, not their default: None
-- is, or a compact form chosen for a value, such as a Last-Modified at 0).
local PAGE_ZERO_KEPT = {ZERO_KEPT}
local function uvarint(raw, pos)
  local value, mul = 0, 1
  while true do
    local b = string.byte(raw, pos)
    if not b then error('a packed page record is cut short', 0) end
    pos = pos + 1
    if b < 128 then return value + b * mul, pos end
    value = value + (b - 128) * mul
    mul = mul * 128
  end
end
local function varint(raw, pos)
  local z
  z, pos = uvarint(raw, pos)
  if z % 2 == 0 then return z / 2, pos end
  return -(z + 1) / 2, pos
end
local function put_uvarint(out, value)
  while value >= 128 do
    local low = value % 128
    out[#out + 1] = string.char(low + 128)
    value = (value - low) / 128
  end
  out[#out + 1] = string.char(value)
end
local function put_varint(out, value)
  if value >= 0 then put_uvarint(out, value * 2) else put_uvarint(out, -value * 2 - 1) end
end
local function unpack_page(raw)
  local mask, pos = uvarint(raw, 1)
  local page = {}
  local base = 0
  local bit = 1
  for _, field in ipairs(PAGE_FIELDS) do
    if bit > mask then break end
    if mask % (2 * bit) >= bit then
      local name, kind = field[1], field[2]
      if kind == 'z' then
        page[name] = true
      elseif kind == 's' then
        local length
        length, pos = uvarint(raw, pos)
        if pos + length - 1 > #raw then error('a packed page record is cut short', 0) end
        page[name] = string.sub(raw, pos, pos + length - 1)
        pos = pos + length
      else
        local value
        value, pos = varint(raw, pos)
        if kind == 'T' then
          base = value + PAGE_EPOCH
          page[name] = base
        elseif kind == 't' then
          page[name] = value + base
        else
          page[name] = value
        end
      end
    end
    bit = bit * 2
  end
  page._mask = mask - mask % bit
  page._tail = string.sub(raw, pos)
  return page
end
local function pack_page(page)
  local mask, body = 0, {}
  local base = page.last_checked or 0
  local bit = 1
  for _, field in ipairs(PAGE_FIELDS) do
    local name, kind = field[1], field[2]
    local value = page[name]
    if value == 0 and kind ~= 's' and not PAGE_ZERO_KEPT[name] then
      value = nil  -- 0 is the default
    end
    if value ~= nil and value ~= false then
      mask = mask + bit
      if kind == 's' then
        put_uvarint(body, #value)
        body[#body + 1] = value
      elseif kind == 'T' then
        put_varint(body, value - PAGE_EPOCH)
      elseif kind == 't' then
        put_varint(body, value - base)
      elseif kind == 'i' then
        put_varint(body, value)
      end
    end
    bit = bit * 2
  end
  local out = {}
  put_uvarint(out, mask + (page._mask or 0))
  return table.concat(out) .. table.concat(body) .. (page._tail or '')
end
local function page_callback(page)
  if page['callback@parse'] then return 'parse' end
  return page.callback
end
local function set_callback(page, name)
  page['callback@parse'], page.callback = nil, nil
  if name == 'parse' then page['callback@parse'] = true else page.callback = name end
end
local function page_summary(raw)
  -- What a summary reads of a record: its callback (nil: none), last
  -- check, next visit and size; strings are skipped, not copied.
  local mask, pos = uvarint(raw, 1)
  local base, callback, visit, size = 0, nil, 0, 0
  local bit = 1
  for _, field in ipairs(PAGE_FIELDS) do
    if bit > mask then break end
    if mask % (2 * bit) >= bit then
      local name, kind = field[1], field[2]
      if kind == 'z' then
        if name == 'callback@parse' then callback = 'parse' end
      elseif kind == 's' then
        local length
        length, pos = uvarint(raw, pos)
        if name == 'callback' then callback = string.sub(raw, pos, pos + length - 1) end
        pos = pos + length
      else
        local value
        value, pos = varint(raw, pos)
        if kind == 'T' then
          base = value + PAGE_EPOCH
        elseif name == 'next_visit' then
          visit = value + base
        elseif name == 'size' then
          size = value
        end
      end
    end
    bit = bit * 2
  end
  return callback, base, visit, size
end
local DUE_HEAD = {}
for n, field in ipairs(PAGE_FIELDS) do
  if field[1] == 'next_visit' then break end
  DUE_HEAD[n] = field[2]
end
local CALLBACK_BITS = {}
for n, field in ipairs(PAGE_FIELDS) do
  if field[1] == 'callback' or field[1] == 'callback@parse' then
    CALLBACK_BITS[#CALLBACK_BITS + 1] = 2 ^ (n - 1)
  end
end
local function due_of_any(raw)
  local mask, pos = uvarint(raw, 1)
  local has = false
  for _, bit in ipairs(CALLBACK_BITS) do
    if mask % (2 * bit) >= bit then has = true end
  end
  if not has then return nil end
  local base, value = 0, 0
  local bit = 1
  for n = 1, #DUE_HEAD do
    if mask % (2 * bit) >= bit then
      value, pos = varint(raw, pos)
      if n == 1 then base = value + PAGE_EPOCH end
    end
    bit = bit * 2
  end
  if mask % (2 * bit) >= bit then
    value, pos = varint(raw, pos)
    return value + base
  end
  return 0
end
-- due_of_any's result, faster: a due read runs it on every page of the
-- buckets it reads (most of its time). The head of a record (the mask and
-- up to five times) is read in one call, and the mask tested with bit ops;
-- a record of a longer head or a mask past 31 bits takes due_of_any.
local DUE_BYTE, DUE_BAND = string.byte, bit.band
local DUE_CALLBACK_MASK = 0
for _, bit in ipairs(CALLBACK_BITS) do DUE_CALLBACK_MASK = DUE_CALLBACK_MASK + bit end
local DUE_FIELDS = #DUE_HEAD + 1
local function due_of(raw)
  local t = {DUE_BYTE(raw, 1, 48)}
  local pos, mask, mul = 1, 0, 1
  while true do
    local c = t[pos]
    if not c then return due_of_any(raw) end
    pos = pos + 1
    if c < 128 then
      mask = mask + c * mul
      break
    end
    mask = mask + (c - 128) * mul
    mul = mul * 128
  end
  if mask >= 2147483648 then return due_of_any(raw) end
  if DUE_BAND(mask, DUE_CALLBACK_MASK) == 0 then return nil end
  local base, bit = 0, 1
  for n = 1, DUE_FIELDS do
    if DUE_BAND(mask, bit) ~= 0 then
      local z, m = 0, 1
      while true do
        local c = t[pos]
        if not c then return due_of_any(raw) end
        pos = pos + 1
        if c < 128 then
          z = z + c * m
          break
        end
        z = z + (c - 128) * m
        m = m * 128
      end
      if z % 2 == 0 then z = z / 2 else z = -(z + 1) / 2 end
      if n == DUE_FIELDS then return z + base end
      if n == 1 then base = z + PAGE_EPOCH end
    elseif n == DUE_FIELDS then
      return 0
    end
    bit = bit * 2
  end
end
