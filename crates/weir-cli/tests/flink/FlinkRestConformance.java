// Checks weir's REST responses against Apache Flink's own REST API schema.
//
// Flink's OpenAPI document (rest_v1_dispatcher.yml) is generated from the MessageHeaders of
// flink-runtime: each names a path, a method and the Java class of its response body. This
// checker loads those classes from a real Flink distribution and reads weir's responses the
// way Flink's own RestClient (and so the `flink` CLI) reads them: with Flink's flexible object
// mapper, which fails on a null for a primitive or an unknown enum value and (as OpenAPI
// allows) accepts fields Flink does not know, made strict (see `strict`): no coercion of
// one JSON type into another. It then
// writes the parsed body back with the same mapper and reports every field Flink would send
// that weir's answer lacks.
//
// Every GET path weir declares in its /openapi.json that Flink also has is checked.
//
// Run: java -cp "$FLINK_HOME/lib/*" FlinkRestConformance.java BASE_URL LABEL [name=value]... [/flink/:template=/concrete/path]...
// Path parameters (jobid, vertexid, checkpointid, ...) come from name=value arguments; a
// template=path argument gives one path its own concrete form, template=SKIP leaves it out
// (a savepoint trigger of a job that finished before any). Exit status 1 on any failure.
import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.*;
import java.util.jar.JarEntry;
import java.util.jar.JarFile;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.flink.runtime.rest.HttpMethodWrapper;
import org.apache.flink.runtime.rest.messages.MessageHeaders;
import org.apache.flink.runtime.rest.util.RestMapperUtils;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JavaType;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.DeserializationFeature;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.MapperFeature;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.cfg.CoercionAction;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.cfg.CoercionInputShape;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.type.LogicalType;

public class FlinkRestConformance {
    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: FlinkRestConformance BASE_URL LABEL [name=value]... [/template=/path]...");
            System.exit(2);
        }
        String base = args[0].replaceAll("/+$", "");
        String label = args[1];
        Map<String, String> params = new HashMap<>();
        Map<String, String> concrete = new HashMap<>();
        for (int i = 2; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq < 0) throw new IllegalArgumentException("not name=value: " + args[i]);
            String k = args[i].substring(0, eq), v = args[i].substring(eq + 1);
            if (k.startsWith("/")) concrete.put(k, v); else params.put(k, v);
        }
        HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
        ObjectMapper mapper = strict(RestMapperUtils.getFlexibleObjectMapper());

        JsonNode openapi = mapper.readTree(get(http, base + "/openapi.json").body());
        Set<String> weirGets = new TreeSet<>();
        for (Iterator<Map.Entry<String, JsonNode>> it = openapi.get("paths").fields(); it.hasNext(); ) {
            Map.Entry<String, JsonNode> e = it.next();
            if (e.getValue().has("get")) weirGets.add(e.getKey().replaceAll("\\{([^}]+)}", ":$1"));
        }

        Map<String, MessageHeaders<?, ?, ?>> flinkGets = flinkGetHeaders();
        int failures = 0, checked = 0;
        List<String> notServed = new ArrayList<>();
        for (Map.Entry<String, MessageHeaders<?, ?, ?>> e : flinkGets.entrySet()) {
            String template = e.getKey();
            if (!weirGets.contains(template)) { notServed.add(template); continue; }
            if ("SKIP".equals(concrete.get(template))) {
                System.out.println("skip " + label + " " + template + " (no such resource here; checked elsewhere)");
                continue;
            }
            checked++;
            String path = concrete.getOrDefault(template, fill(template, params));
            if (path == null) {
                System.out.println("FAIL " + label + " " + template + ": no value for its path parameters; pass name=value");
                failures++;
                continue;
            }
            MessageHeaders<?, ?, ?> h = e.getValue();
            try {
                HttpResponse<String> r = get(http, base + path);
                if (r.statusCode() != h.getResponseStatusCode().code()) {
                    throw new IllegalStateException("status " + r.statusCode() + " (Flink answers "
                            + h.getResponseStatusCode().code() + "): " + abbreviate(r.body()));
                }
                JavaType type = h.getResponseTypeParameters().isEmpty()
                        ? mapper.constructType(h.getResponseClass())
                        : mapper.getTypeFactory().constructParametricType(h.getResponseClass(),
                                h.getResponseTypeParameters().stream().map(mapper::constructType).toArray(JavaType[]::new));
                JsonNode sent = mapper.readTree(r.body());
                Object parsed = mapper.readValue(r.body(), type);
                JsonNode flink = mapper.valueToTree(parsed);
                List<String> missing = new ArrayList<>();
                missingFields("", flink, sent, missing);
                if (!missing.isEmpty()) throw new IllegalStateException("lacks Flink's fields " + missing);
                System.out.println("ok   " + label + " " + template + " (" + h.getResponseClass().getSimpleName() + ")");
            } catch (Exception ex) {
                failures++;
                System.out.println("FAIL " + label + " " + template + " " + path + " as "
                        + h.getResponseClass().getSimpleName() + ": " + oneLine(ex));
            }
        }
        System.out.println("checked " + checked + " of Flink's " + flinkGets.size() + " GET paths (" + label
                + "); not served by weir: " + notServed);
        System.out.println(failures == 0 ? "CONFORMS " + label : "DOES NOT CONFORM " + label + ": " + failures + " failure(s)");
        System.exit(failures == 0 ? 0 : 1);
    }

    /**
     * Flink's flexible mapper made strict about types: Jackson's default coercions (a string
     * read as a number or boolean, a number or boolean as a string, a fraction as a whole
     * number) fail. Missing fields are not refused here (Flink's own server leaves out its
     * null ones, and its mapper reads them as null); `missingFields` reports those Flink
     * would send with a value.
     */
    static ObjectMapper strict(ObjectMapper flexible) {
        ObjectMapper mapper = flexible.copy();
        mapper.configure(MapperFeature.ALLOW_COERCION_OF_SCALARS, false);
        mapper.disable(DeserializationFeature.ACCEPT_FLOAT_AS_INT);
        mapper.enable(DeserializationFeature.FAIL_ON_NULL_FOR_PRIMITIVES);
        for (LogicalType t : new LogicalType[] {LogicalType.Integer, LogicalType.Float, LogicalType.Boolean}) {
            mapper.coercionConfigFor(t).setCoercion(CoercionInputShape.String, CoercionAction.Fail);
        }
        mapper.coercionConfigFor(LogicalType.Integer).setCoercion(CoercionInputShape.Float, CoercionAction.Fail);
        for (CoercionInputShape shape : new CoercionInputShape[] {
                CoercionInputShape.Integer, CoercionInputShape.Float, CoercionInputShape.Boolean}) {
            mapper.coercionConfigFor(LogicalType.Textual).setCoercion(shape, CoercionAction.Fail);
        }
        return mapper;
    }

    /** Fields Flink's serialisation of the parsed body has that weir's response lacks. */
    static void missingFields(String at, JsonNode flink, JsonNode sent, List<String> out) {
        if (flink.isObject()) {
            if (!sent.isObject()) return;
            for (Iterator<Map.Entry<String, JsonNode>> it = flink.fields(); it.hasNext(); ) {
                Map.Entry<String, JsonNode> f = it.next();
                String here = at + "/" + f.getKey();
                if (!sent.has(f.getKey())) {
                    if (!f.getValue().isNull()) out.add(here);
                } else {
                    missingFields(here, f.getValue(), sent.get(f.getKey()), out);
                }
            }
        } else if (flink.isArray() && sent.isArray()) {
            for (int i = 0; i < Math.min(flink.size(), sent.size()); i++) {
                missingFields(at + "/" + i, flink.get(i), sent.get(i), out);
            }
        }
    }

    static String fill(String template, Map<String, String> params) {
        Matcher m = Pattern.compile(":([A-Za-z]+)").matcher(template);
        StringBuilder sb = new StringBuilder();
        while (m.find()) {
            String v = params.get(m.group(1));
            if (v == null) return null;
            m.appendReplacement(sb, Matcher.quoteReplacement(v));
        }
        m.appendTail(sb);
        return sb.toString();
    }

    static HttpResponse<String> get(HttpClient http, String url) throws Exception {
        HttpRequest req = HttpRequest.newBuilder(URI.create(url)).timeout(Duration.ofSeconds(10)).GET().build();
        return http.send(req, HttpResponse.BodyHandlers.ofString());
    }

    /** Every GET MessageHeaders in flink-runtime, by its URL template. */
    static Map<String, MessageHeaders<?, ?, ?>> flinkGetHeaders() throws Exception {
        String jarPath = MessageHeaders.class.getProtectionDomain().getCodeSource().getLocation().toURI().getPath();
        Map<String, MessageHeaders<?, ?, ?>> out = new TreeMap<>();
        try (JarFile jar = new JarFile(jarPath)) {
            for (Enumeration<JarEntry> en = jar.entries(); en.hasMoreElements(); ) {
                String n = en.nextElement().getName();
                if (!n.startsWith("org/apache/flink/runtime/rest/") || !n.endsWith("Headers.class") || n.contains("$")) continue;
                Class<?> c;
                try {
                    c = Class.forName(n.replace('/', '.').replace(".class", ""), false, FlinkRestConformance.class.getClassLoader());
                } catch (Throwable t) {
                    continue;
                }
                if (!MessageHeaders.class.isAssignableFrom(c) || Modifier.isAbstract(c.getModifiers())) continue;
                MessageHeaders<?, ?, ?> h = instance(c);
                if (h == null || h.getHttpMethod() != HttpMethodWrapper.GET) continue;
                out.put(h.getTargetRestEndpointURL(), h);
            }
        }
        return out;
    }

    static MessageHeaders<?, ?, ?> instance(Class<?> c) {
        try {
            return (MessageHeaders<?, ?, ?>) c.getMethod("getInstance").invoke(null);
        } catch (Throwable ignored) {
        }
        for (Field f : c.getDeclaredFields()) {
            if (Modifier.isStatic(f.getModifiers()) && c.isAssignableFrom(f.getType())) {
                try {
                    f.setAccessible(true);
                    return (MessageHeaders<?, ?, ?>) f.get(null);
                } catch (Throwable ignored) {
                }
            }
        }
        try {
            var k = c.getDeclaredConstructor();
            k.setAccessible(true);
            return (MessageHeaders<?, ?, ?>) k.newInstance();
        } catch (Throwable ignored) {
            return null;
        }
    }

    static String oneLine(Throwable t) {
        String m = String.valueOf(t.getMessage()).replaceAll("\\s+", " ");
        return t.getClass().getSimpleName() + ": " + abbreviate(m);
    }

    static String abbreviate(String s) {
        return s.length() > 400 ? s.substring(0, 400) + "..." : s;
    }
}
