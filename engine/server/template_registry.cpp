#include "server/template_registry.h"

#include <algorithm>

#include "cache/activation_store.h"
#include "pipeline/edit_model.h"
#include "pipeline/image_io.h"
#include "pipeline/template_image.h"
#include "server/model_registry.h"

namespace infill {
namespace {

std::span<const std::byte> as_bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

ApiReply not_found_reply(std::string_view id) {
  return error_reply(404, "template_not_found",
                     "template " + std::string(id) + " is not known (upload it with POST /v1/templates)");
}

}  // namespace

TemplateRegistry::TemplateRegistry(const ModelRegistry& models, int max_templates, int64_t max_image_pixels, bool keep_bytes)
    : models_(models),
      max_templates_(max_templates),
      max_image_pixels_(max_image_pixels),
      keep_bytes_(keep_bytes || models.size() > 1) {}

double TemplateRegistry::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - epoch_).count();
}

nlohmann::json TemplateRegistry::json_locked(const Record& t) const {
  std::string state = "ready";
  if (t.prepared || models_.store().contains(models_.model(0).cache_key(*t.tmpl, EditParams{}))) state = "prepared";
  else if (t.waiting > 0) state = "preparing";
  return {{"id", t.tmpl->id},
          {"name", t.name},
          {"width", t.tmpl->width},
          {"height", t.tmpl->height},
          {"model_width", t.tmpl->model_width},
          {"model_height", t.tmpl->model_height},
          {"format", pixel_format_name(t.tmpl->pixels.format)},
          {"channels", t.tmpl->pixels.channels},
          {"file_format", t.tmpl->pixels.file_format},
          {"result_format", image_file_format_name(native_file_format(t.tmpl->pixels))},
          {"colour", t.tmpl->pixels.scene_linear ? "scene_linear" : "display"},
          {"icc_profile_bytes", t.tmpl->pixels.icc_profile.size()},
          {"state", state},
          {"edits_waiting", t.waiting}};
}

ApiReply TemplateRegistry::upload(const std::string& bytes, const std::string& name) {
  if (bytes.empty()) return error_reply(400, "empty_body", "template upload " + name + " is empty; send the image file as the body");
  const EditModel& model = models_.model(0);
  // The server's pixel limit is checked from the header before the full decode (make_template
  // applies only the model's own limit).
  if (max_image_pixels_ < model.info().max_image_pixels) {
    auto probe = decode_image(as_bytes(bytes), name, max_image_pixels_);
    if (!probe.ok()) return status_reply(probe.status(), true);
  }
  auto t = model.make_template(as_bytes(bytes), name);
  if (!t.ok()) return status_reply(t.status(), true);
  std::lock_guard lock(mu_);
  auto [it, inserted] = templates_.try_emplace((*t)->id);
  if (inserted) {
    it->second.tmpl = *t;
    it->second.name = name;
    if (keep_bytes_) it->second.bytes = std::make_shared<const std::string>(bytes);
    ++created_;
  }
  it->second.last_used_ms = now_ms();
  // LRU beyond the limit; live edits keep their own reference to the pixels.
  while (templates_.size() > static_cast<size_t>(max_templates_)) {
    auto victim = templates_.begin();
    for (auto i = templates_.begin(); i != templates_.end(); ++i)
      if (i->second.last_used_ms < victim->second.last_used_ms) victim = i;
    templates_.erase(victim);
  }
  return json_reply(inserted ? 201 : 200, json_locked(it->second));
}

ApiReply TemplateRegistry::status(std::string_view id) const {
  std::lock_guard lock(mu_);
  auto it = templates_.find(std::string(id));
  if (it == templates_.end()) return not_found_reply(id);
  return json_reply(200, json_locked(it->second));
}

// Another model's encoding is made lazily, from the kept file bytes, and then kept with the
// template (evicted with it): an upload costs one encode however many models are loaded, and a
// template edited with one model never pays for the others. Two edits racing to encode the same
// pair both compute it and the first stored wins (the results are identical).
std::variant<std::shared_ptr<const TemplateImage>, ApiReply> TemplateRegistry::for_model(const std::string& id, size_t slot) {
  const EditModel& m = models_.model(slot);
  const std::string& model_id = m.info().id;
  std::shared_ptr<const std::string> bytes;
  std::string name;
  {
    std::lock_guard lock(mu_);
    auto it = templates_.find(id);
    if (it == templates_.end()) return not_found_reply(id);
    it->second.last_used_ms = now_ms();
    if (slot == 0) return it->second.tmpl;
    if (auto e = it->second.other_models.find(model_id); e != it->second.other_models.end()) return e->second;
    bytes = it->second.bytes;
    name = it->second.name;
  }
  if (!bytes)  // kept whenever several models are loaded; a bug otherwise
    return error_reply(500, "internal", "template " + id + " has no kept file to encode for model " + model_id);
  auto t = m.make_template(as_bytes(*bytes), name);
  if (!t.ok())
    return status_reply(Status(t.status().code(), "template " + id + " for model " + model_id + ": " + t.status().message()), true);
  std::lock_guard lock(mu_);
  auto it = templates_.find(id);
  if (it == templates_.end()) return *t;  // evicted meanwhile: the edit keeps its own reference
  return it->second.other_models.try_emplace(model_id, *t).first->second;
}

std::optional<JournaledTemplate> TemplateRegistry::edit_waiting(const std::string& id, bool journal_first) {
  std::lock_guard lock(mu_);
  // The template may have been evicted meanwhile; the edit holds its own reference.
  auto t = templates_.find(id);
  if (t == templates_.end()) return std::nullopt;
  ++t->second.waiting;
  if (journal_first && !t->second.journaled && t->second.bytes) return JournaledTemplate{id, t->second.name, *t->second.bytes};
  return std::nullopt;
}

void TemplateRegistry::edit_stopped_waiting(const std::string& id, bool prepared) {
  std::lock_guard lock(mu_);
  auto t = templates_.find(id);
  if (t == templates_.end()) return;
  t->second.waiting = std::max(0, t->second.waiting - 1);
  t->second.prepared = t->second.prepared || prepared;
}

void TemplateRegistry::journaled(const std::string& id) {
  std::lock_guard lock(mu_);
  if (auto t = templates_.find(id); t != templates_.end()) t->second.journaled = true;
}

std::optional<JournaledTemplate> TemplateRegistry::unjournaled_file(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto t = templates_.find(id);
  if (t == templates_.end() || t->second.journaled || !t->second.bytes) return std::nullopt;
  return JournaledTemplate{id, t->second.name, *t->second.bytes};
}

bool TemplateRegistry::contains(const std::string& id) const {
  std::lock_guard lock(mu_);
  return templates_.count(id) > 0;
}

size_t TemplateRegistry::size() const {
  std::lock_guard lock(mu_);
  return templates_.size();
}

uint64_t TemplateRegistry::created() const {
  std::lock_guard lock(mu_);
  return created_;
}

}  // namespace infill
