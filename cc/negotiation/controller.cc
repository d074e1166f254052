#include "cc/negotiation/controller.h"

#include <algorithm>
#include <utility>

#include "cc/logging.h"
#include "cc/negotiation/wire_format.h"

namespace tfring {
namespace {

// Flag bits of the first word (stored inverted, so the AND yields an OR).
constexpr uint64_t kNeedsNegotiation = 1ull << 0;
// Flag bits of the agreed word (plain, so the AND says "every rank").
constexpr uint64_t kProcessSetChangeStaged = 1ull << 0;

// A cache hit that has not been agreed for this long is sent to the
// coordinator, so the stall report can name the ranks that are missing it.
constexpr double kStaleHitSeconds = 1.0;

bool TestBit(const std::vector<uint64_t>& bits, int64_t word0, int64_t index) {
  return (bits[word0 + index / 64] >> (index % 64)) & 1;
}
void SetBit(std::vector<uint64_t>* bits, int64_t word0, int64_t index) {
  (*bits)[word0 + index / 64] |= 1ull << (index % 64);
}
void ClearBit(std::vector<uint64_t>* bits, int64_t word0, int64_t index) {
  (*bits)[word0 + index / 64] &= ~(1ull << (index % 64));
}

}  // namespace

Controller::Controller(Transport* transport, const Config& config, std::vector<int> world_ranks,
                       int num_root_words)
    : transport_(transport),
      config_(config),
      world_ranks_(std::move(world_ranks)),
      cache_(config.cache_capacity) {
  const int64_t cache_words = cache_.num_words();
  const int64_t rank_words = (transport_->size() + 63) / 64;
  layout_.flags = 0;
  layout_.hits = 1;
  layout_.invalid = layout_.hits + cache_words;
  layout_.shutdown_ranks = layout_.invalid + cache_words;
  layout_.agreed = layout_.shutdown_ranks + rank_words;
  layout_.root = layout_.agreed + 1;
  layout_.total = layout_.root + num_root_words;
  if (transport_->rank() == 0) {
    coordinator_ = std::make_unique<Coordinator>(world_ranks_, config_);
  }
}

std::vector<uint64_t> Controller::BuildBits(const RoundInputs& inputs, Clock::time_point now) {
  std::vector<uint64_t> bits(layout_.total, 0);
  // Inverted sections start all ones; a rank clears a bit to raise it.
  for (int64_t w = 0; w < layout_.hits; ++w) bits[w] = ~0ull;
  for (int64_t w = layout_.invalid; w < layout_.agreed; ++w) bits[w] = ~0ull;
  if (inputs.process_set_change_staged) bits[layout_.agreed] |= kProcessSetChangeStaged;
  // Root words: the AND of rank 0's value with everyone else's all ones.
  const int64_t root_words = layout_.total - layout_.root;
  TFRING_CHECK(static_cast<int64_t>(inputs.root_words.size()) == root_words,
               "round with " << inputs.root_words.size() << " root words, expected "
                             << root_words);
  for (int64_t w = 0; w < root_words; ++w) {
    bits[layout_.root + w] = transport_->rank() == 0 ? inputs.root_words[w] : ~0ull;
  }

  bool needs_negotiation = false;
  for (Pending& pending : pending_) {
    pending.cache_slot = -1;
    if (pending.sent_to_coordinator) {
      // Keep rounds negotiating until the coordinator has everyone's copy.
      needs_negotiation = true;
      continue;
    }
    if (pending.request.type == CollectiveType::kJoin) {
      needs_negotiation = true;  // joins are never cached
      continue;
    }
    const ResponseCache::Lookup lookup = cache_.Find(pending.request);
    switch (lookup.state) {
      case ResponseCache::State::kHit:
        pending.cache_slot = lookup.slot;
        SetBit(&bits, layout_.hits, lookup.slot);
        if (std::chrono::duration<double>(now - pending.since).count() > kStaleHitSeconds) {
          needs_negotiation = true;
        }
        break;
      case ResponseCache::State::kInvalid:
        ClearBit(&bits, layout_.invalid, lookup.slot);
        needs_negotiation = true;
        break;
      case ResponseCache::State::kMiss:
        needs_negotiation = true;
        break;
    }
  }
  if (needs_negotiation) bits[layout_.flags] &= ~kNeedsNegotiation;
  if (inputs.request_shutdown) ClearBit(&bits, layout_.shutdown_ranks, transport_->rank());
  return bits;
}

void Controller::TakeCachedResponses(const std::vector<uint64_t>& bits, RoundOutcome* outcome) {
  // Agreed: every rank hit the slot and no rank contradicted it.
  std::vector<int64_t> agreed_slots;
  for (const Pending& pending : pending_) {
    const int64_t slot = pending.cache_slot;
    if (slot >= 0 && TestBit(bits, layout_.hits, slot) && TestBit(bits, layout_.invalid, slot)) {
      agreed_slots.push_back(slot);
    }
  }
  std::sort(agreed_slots.begin(), agreed_slots.end());
  for (int64_t slot : agreed_slots) {
    outcome->responses.push_back(cache_.At(slot));
    cache_.Touch(slot);
    submitted_.push_back(RemovePending(outcome->responses.back().name()));
  }
  // Entries some rank contradicted are dropped everywhere; the requests
  // concerned are renegotiated in full.
  // Every rank's cache holds the same slots, so no rank clears a bit past them.
  for (int64_t slot = 0; slot < cache_.allocated_slots(); ++slot) {
    if (!TestBit(bits, layout_.invalid, slot)) cache_.Evict(slot);
  }
}

Status Controller::RunRound(std::vector<SubmittedRequest> new_requests,
                            const RoundInputs& inputs, RoundOutcome* outcome) {
  *outcome = RoundOutcome();
  submitted_.clear();
  const Clock::time_point now = Clock::now();
  for (SubmittedRequest& submitted : new_requests) {
    submitted.request.rank = world_ranks_[transport_->rank()];
    pending_.push_back(Pending{std::move(submitted.request), submitted.submitted});
  }

  std::vector<uint64_t> bits = BuildBits(inputs, now);
  TFRING_RETURN_IF_ERROR(transport_->BitwiseAndAllreduce(&bits));
  outcome->root_words.assign(bits.begin() + layout_.root, bits.end());
  TakeCachedResponses(bits, outcome);
  outcome->process_set_change_agreed = (bits[layout_.agreed] & kProcessSetChangeStaged) != 0;

  std::vector<int> shutdown_ranks;
  for (int rank = 0; rank < transport_->size(); ++rank) {
    if (!TestBit(bits, layout_.shutdown_ranks, rank)) shutdown_ranks.push_back(world_ranks_[rank]);
  }
  if (!shutdown_ranks.empty()) {
    outcome->shutdown = true;
    outcome->shutdown_reason =
        RanksToString(shutdown_ranks) +
        " shut down (tfring.shutdown() or process exit; its output says why it stopped)";
    return Status::OK();
  }
  if ((bits[layout_.flags] & kNeedsNegotiation) == 0) {
    TFRING_RETURN_IF_ERROR(Negotiate(now, outcome));
  }
  outcome->agreed = Clock::now();
  if (inputs.report_readiness && !outcome->responses.empty()) {
    TFRING_RETURN_IF_ERROR(ReportReadiness(outcome));
  }
  return Status::OK();
}

Status Controller::ReportReadiness(RoundOutcome* outcome) {
  // Every rank leaves the round at nearly the same moment, so "waited this
  // long before the end of the round" places each rank's submission on rank
  // 0's clock without synchronised clocks.
  std::vector<int64_t> waited;
  waited.reserve(submitted_.size());
  for (const Clock::time_point submitted : submitted_) {
    waited.push_back(submitted == Clock::time_point()
                         ? -1
                         : std::chrono::duration_cast<std::chrono::microseconds>(
                               outcome->agreed - submitted)
                               .count());
  }
  return transport_->AllgatherInt64s(waited, &outcome->waited_us);
}

Status Controller::Negotiate(Clock::time_point now, RoundOutcome* outcome) {
  ++negotiation_rounds_;
  std::vector<Request> to_send;
  for (Pending& pending : pending_) {
    if (!pending.sent_to_coordinator) {
      pending.sent_to_coordinator = true;
      to_send.push_back(pending.request);
    }
  }
  std::vector<std::string> gathered;
  TFRING_RETURN_IF_ERROR(transport_->GatherToRoot(EncodeRequests(to_send), &gathered));

  std::string encoded_responses;
  if (coordinator_) {
    for (const std::string& bytes : gathered) {
      std::vector<Request> requests;
      TFRING_RETURN_IF_ERROR(DecodeRequests(bytes, &requests));
      coordinator_->Add(requests, now);
    }
    const std::string shutdown_reason = coordinator_->InspectStalls(now);
    encoded_responses = EncodeResponses(coordinator_->TakeReady(), shutdown_reason);
  }
  TFRING_RETURN_IF_ERROR(transport_->BroadcastFromRoot(&encoded_responses));

  ResponseList negotiated;
  std::string shutdown_reason;
  TFRING_RETURN_IF_ERROR(DecodeResponses(encoded_responses, &negotiated, &shutdown_reason));
  for (Response& response : negotiated) {
    // A join, and a tensor some ranks sat out, are answered anew each time.
    if (!response.is_error && response.contributors == 0 &&
        response.request.type != CollectiveType::kJoin) {
      cache_.Put(response);
    }
    submitted_.push_back(RemovePending(response.name(), response.is_error));
    outcome->responses.push_back(std::move(response));
  }
  if (!shutdown_reason.empty()) {
    outcome->shutdown = true;
    outcome->shutdown_reason = shutdown_reason;
  }
  return Status::OK();
}

std::vector<std::string> Controller::PendingNames() const {
  std::vector<std::string> names;
  for (const Pending& pending : pending_) names.push_back(pending.request.name);
  return names;
}

Controller::Clock::time_point Controller::RemovePending(const std::string& name,
                                                       bool is_error) {
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [&](const Pending& p) { return p.request.name == name; });
  if (it != pending_.end()) {
    const Clock::time_point since = it->since;
    pending_.erase(it);
    return since;
  }
  // A rank that has joined takes part in tensors it never submitted; a
  // collective refused while a rank has joined is refused as soon as one
  // rank submits it, so the others may not have sent it (yet, or ever).
  const bool joined = std::any_of(pending_.begin(), pending_.end(), [](const Pending& p) {
    return p.request.type == CollectiveType::kJoin;
  });
  TFRING_CHECK(joined || is_error, "response for '" << name << "' that this rank never sent");
  return Clock::time_point();
}

}  // namespace tfring
