-- acquire_many: take several locks of one cluster slot at once, all or
-- none: each name free or already this caller's is taken (or re-entered)
-- exactly as acquire.lua would take it, but only when every name is; else
-- nothing is written except the `waited` mark on the first name in the way.
--
-- KEYS[2i-1]  lock key of name i   (hash: flag, count, fence, req, waited)
-- KEYS[2i]    fence key of name i  (string: its fencing counter)
-- ARGV[1]     identity of the caller
-- ARGV[2]     TTL of the fence counters in milliseconds
-- ARGV[3]     this request's number (release_request.lua undoes each name
--             it took, by name, if the reply is lost)
-- ARGV[4]     how the caller asks, as acquire.lua's ARGV[7]
-- ARGV[5]     a Redlock quorum's proposed fencing token ("0": none), for
--             every name the caller has no live guards of (see acquire.lua
--             and next_fence): when each master of a majority issues the
--             proposal for a name, that name needs no second round
-- ARGV[6]     tokens to set aside above each fresh ownership's (see
--             acquire.lua and next_fence)
-- then per name i, from ARGV[7]:
-- ARGV[5i+2]  lease in milliseconds (of a fresh ownership, or of the one
--             re-entered)
-- ARGV[5i+3]  fencing token of the caller's live guards on name i, "0": none
-- ARGV[5i+4]  the caller's depth on name i after this acquisition
-- ARGV[5i+5]  the owner the caller's live guards on name i hold it as (the
--             identity of the thread of its process that took it in
--             Redis, which may have passed it on in memory), "" with none
-- ARGV[5i+6]  "1" when name i must be free to be taken (see acquire.lua's
--             ARGV[10]), else "0"
--
-- Returns {1, fence1, depth1, fence2, depth2, ...}  every name acquired
--         {0, i, pttl}  name i (1-based) is held by another identity, with
--                       pttl ms of lease left (-1: none); nothing was taken
--         {0, i, pttl, -1}  name i is in its hand-over window for pttl ms
--                       more, kept for a caller that asked before this one
--
-- An error (WRONGTYPE on a lock or a fence key) comes before any lock is
-- written, so it leaves every name as it was (a fence counter may have
-- moved ahead): all or none holds for errors too.
-- Only the first name in the way gets the `waited`, `seen` and `queued`
-- marks (see acquire.lua): the caller parks on that name's baton, and a mark
-- on the others would make their releases push batons nobody waits for.
-- A name in its hand-over window is taken as acquire.lua takes it, except
-- that a window is never its waiter's alone here: this script does not name
-- the batons, so a caller kept out could not tell that waiter (see
-- tell_kept_waiter in lib/hand_over.lua); after a caller that asked before
-- the window opened takes it, the kept waiter finds the name held and
-- waits behind it.
-- next_fence, extend_lease, may_take, mark_in_the_way and take_window
-- come from lib/, prepended when the script is built.
local identity = ARGV[1]
local asking = tonumber(ARGV[4])
local names = #KEYS / 2
local reenter = {}
-- The names in their hand-over window.
local window = {}

for i = 1, names do
  local lock = KEYS[2 * i - 1]
  local held = redis.call('HMGET', lock, 'flag', 'fence', 'handover', 'for', 'since', 'next', 'nsince', 'queued')
  local mine = ARGV[5 * i + 3]
  if mine ~= '0' and held[1] == ARGV[5 * i + 5] and held[2] == mine then
    reenter[i] = true
  elseif held[3] and not may_take(held[3], held[4], false, asking, identity) then
    return {0, i, redis.call('PTTL', lock), -1}
  elseif held[1] ~= false and (held[1] ~= identity or ARGV[5 * i + 6] == '1') then
    mark_in_the_way(lock, held[1], held[8], held[5], identity, asking, nil)
    return {0, i, redis.call('PTTL', lock)}
  elseif held[3] then
    window[i] = held
  end
end

-- Every name is free or the caller's: the fresh names' tokens first, so
-- that a fence key that is not an integer fails the call before any lock
-- is written (the counters of names before it only move ahead, which a
-- fencing counter may always do; the damaged one is put back as it was).
-- One clock for all of them.
local tokens = {}
local now = nil
for i = 1, names do
  if not reenter[i] then
    -- As acquire.lua: the proposal only for a name the caller has no
    -- live guards of (a re-entry whose copy is missing here is a
    -- minority's, taken afresh without it).
    local proposed = nil
    if ARGV[5 * i + 3] == '0' then
      proposed = ARGV[5]
    end
    now = now or redis.call('TIME')
    local fence, err, token = next_fence(KEYS[2 * i], ARGV[2], proposed, ARGV[6], now)
    if err then
      return err
    end
    tokens[i] = {fence, token}
  end
end

local reply = {1}
for i = 1, names do
  local lock = KEYS[2 * i - 1]
  local lease = ARGV[5 * i + 2]
  local depth = ARGV[5 * i + 4]
  if reenter[i] then
    redis.call('HSET', lock, 'count', depth)
    extend_lease(lock, lease)
    reply[#reply + 1] = tonumber(ARGV[5 * i + 3])
    reply[#reply + 1] = tonumber(depth)
  else
    local token = tokens[i][2]
    if window[i] then
      take_window(lock, identity, token, ARGV[3], asking, window[i][6], window[i][7])
    elseif asking > 0 then
      redis.call('HSET', lock, 'flag', identity, 'count', '1', 'fence', token, 'req', ARGV[3], 'waited', '1')
    else
      redis.call('HSET', lock, 'flag', identity, 'count', '1', 'fence', token, 'req', ARGV[3])
    end
    redis.call('PEXPIRE', lock, lease)
    reply[#reply + 1] = tokens[i][1]
    reply[#reply + 1] = 1
  end
end
return reply
