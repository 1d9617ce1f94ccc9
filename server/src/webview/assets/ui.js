// gangway web view: the page side. htmx fetches panels again on their server-sent
// events; this script only opens a node's detail on click, shows whether the event
// stream is live, and records when panels change (window.gangwayUpdates: the browser
// test and `gangway bench ui` read it).
window.gangwayUpdates = [];

// A page left for another may be kept alive by the browser (back/forward cache) with its
// event stream open; six such streams take every connection the browser allows one host,
// and the next page waits for one. The stream closes when the page is hidden, and opens
// again if it is shown from that cache.
var gangwaySources = [];
var gangwayCreate = htmx.createEventSource;
htmx.createEventSource = function (url) {
  var source = gangwayCreate(url);
  gangwaySources = gangwaySources.filter(function (s) { return s.readyState !== 2; });
  gangwaySources.push(source);
  return source;
};
window.addEventListener("pagehide", function () {
  gangwaySources.forEach(function (s) { s.close(); });
  gangwaySources = [];
});
window.addEventListener("pageshow", function (e) {
  if (e.persisted) window.location.reload();
});

document.addEventListener("click", function (e) {
  var cell = e.target.closest("[data-n]");
  if (!cell) return;
  e.preventDefault();
  var name = cell.getAttribute("data-n");
  if (!document.getElementById("node")) {
    window.location = "/ui/fleet?name=" + encodeURIComponent(name);
    return;
  }
  document.querySelectorAll(".cell.sel").forEach(function (c) { c.classList.remove("sel"); });
  cell.classList.add("sel");
  htmx.ajax("GET", "/ui/panel/node?name=" + encodeURIComponent(name), { target: "#node", swap: "innerHTML" });
});

function setLive(text, cls) {
  var live = document.getElementById("live");
  if (live) { live.textContent = text; live.className = cls; }
}

document.addEventListener("htmx:sseOpen", function () { setLive("live", "ok"); });
document.addEventListener("htmx:sseError", function () { setLive("reconnecting", "warn"); });
document.addEventListener("htmx:afterSwap", function (e) {
  window.gangwayUpdates.push({ target: e.detail.target.id, at: Date.now() });
  if (window.gangwayUpdates.length > 1000) window.gangwayUpdates.shift();
});
